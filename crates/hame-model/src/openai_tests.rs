use hame_core::{
    ContentBlock, Message, ModelEvent, ModelParams, ModelRequest, ResponseAssembler, Role,
    StopReason, ToolCall, ToolResult, ToolSpec, Usage,
};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;
use crate::http::SseParser;

fn conversation() -> ModelRequest {
    ModelRequest {
        system: "be brief".into(),
        messages: vec![
            Message::user("list files"),
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentBlock::Reasoning {
                        text: "hmm".into(),
                        signature: None,
                    },
                    ContentBlock::ToolCall(ToolCall {
                        id: "call_1".into(),
                        name: "ls".into(),
                        arguments: String::new(),
                    }),
                    ContentBlock::ToolCall(ToolCall {
                        id: "call_2".into(),
                        name: "read_file".into(),
                        arguments: r#"{"path":"a"}"#.into(),
                    }),
                ]
                .into(),
                usage: None,
            },
            Message::tool_results(vec![
                ToolResult {
                    id: "call_1".into(),
                    content: "a\nb".into(),
                    is_error: false,
                    code: None,
                },
                ToolResult {
                    id: "call_2".into(),
                    content: "Error [file_not_found]: a".into(),
                    is_error: true,
                    code: Some("file_not_found".into()),
                },
            ]),
        ],
        tools: vec![ToolSpec {
            name: "ls".into(),
            description: "list".into(),
            parameters: json!({"type": "object", "properties": {}}).into(),
        }],
        params: ModelParams {
            temperature: Some(0.5),
            max_tokens: Some(100),
        },
        cache_key: Some("hame-0123456789abcdef".into()),
    }
}

#[test]
fn request_mapping() -> Result<(), serde_json::Error> {
    let conversation = conversation();
    let local = OpenAiConfig {
        base_url: "http://localhost:8000/v1".into(),
        ..OpenAiConfig::new("m")
    };
    let body = serde_json::to_value(request_body(&local, &conversation, true))?;
    assert_eq!(
        body,
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a\nb"},
                {"role": "tool", "tool_call_id": "call_2", "content": "Error [file_not_found]: a"}
            ],
            "tools": [{"type": "function", "function": {"name": "ls", "description": "list",
                       "parameters": {"type": "object", "properties": {}}}}],
            "temperature": 0.5,
            "max_tokens": 100,
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
    let official =
        serde_json::to_value(request_body(&OpenAiConfig::new("m"), &conversation, false))?;
    assert_eq!(official["max_completion_tokens"], json!(100));
    assert_eq!(official.get("max_tokens"), None);
    assert_eq!(official.get("stream_options"), None);
    assert_eq!(official["stream"], json!(false));
    // The prompt cache key goes to api.openai.com by default, elsewhere when asked.
    assert_eq!(official["prompt_cache_key"], json!("hame-0123456789abcdef"));
    assert_eq!(body.get("prompt_cache_key"), None);
    let asked = OpenAiConfig {
        prompt_cache_key: Some(true),
        ..local.clone()
    };
    let asked = serde_json::to_value(request_body(&asked, &conversation, true))?;
    assert_eq!(asked["prompt_cache_key"], json!("hame-0123456789abcdef"));
    let refused = OpenAiConfig {
        prompt_cache_key: Some(false),
        ..OpenAiConfig::new("m")
    };
    let refused = serde_json::to_value(request_body(&refused, &conversation, false))?;
    assert_eq!(refused.get("prompt_cache_key"), None);
    Ok(())
}

/// A usage block as api.openai.com returns it on a cache hit (recorded), whole and as the
/// last chunk of a stream.
#[test]
fn recorded_cached_usage_is_read_back() -> Result<(), ModelError> {
    let usage = json!({"prompt_tokens": 2_006, "completion_tokens": 300, "total_tokens": 2_306,
        "prompt_tokens_details": {"cached_tokens": 1_920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}});
    let expected = Usage {
        input_tokens: 2_006,
        output_tokens: 300,
        cached_input_tokens: 1_920,
        cache_write_input_tokens: 0,
    };
    let whole = json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."},
                     "finish_reason": "stop"}],
        "usage": usage});
    let mut asm = ResponseAssembler::default();
    parse_response(&whole)?.iter().for_each(|e| asm.push(e));
    assert_eq!(asm.finish().usage, Some(expected));
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
                       "usage": usage})
    .to_string();
    let mut p = StreamParser::default();
    let events = run(&mut p, &[chunk.as_str(), "[DONE]"])?;
    assert!(events.contains(&ModelEvent::Usage(expected)), "{events:?}");
    Ok(())
}

fn run(parser: &mut StreamParser, lines: &[&str]) -> Result<Vec<ModelEvent>, ModelError> {
    let mut out = Vec::new();
    for l in lines {
        out.extend(parser.on_event("message", l)?);
    }
    out.extend(parser.finish()?);
    Ok(out)
}

#[test]
fn stream_assembles_split_arguments() -> Result<(), ModelError> {
    let mut p = StreamParser::default();
    let events = run(
        &mut p,
        &[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"think"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c0","type":"function","function":{"name":"read_file","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c1","type":"function","function":{"name":"ls","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\":\"x\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            "[DONE]",
        ],
    )?;
    assert!(p.is_done());
    assert_eq!(events.last(), Some(&ModelEvent::Stop(StopReason::ToolUse)));
    let mut asm = ResponseAssembler::default();
    events.iter().for_each(|e| asm.push(e));
    let r = asm.finish();
    assert_eq!(
        *r.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "think".into(),
                signature: None
            },
            ContentBlock::ToolCall(ToolCall {
                id: "c0".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"x"}"#.into()
            }),
            ContentBlock::ToolCall(ToolCall {
                id: "c1".into(),
                name: "ls".into(),
                arguments: "{}".into()
            }),
        ]
    );
    assert_eq!(
        r.usage,
        Some(Usage {
            input_tokens: 9,
            output_tokens: 4,
            cached_input_tokens: 2,
            cache_write_input_tokens: 0,
        })
    );
    Ok(())
}

#[test]
fn truncated_stream_is_a_transport_error() {
    let mut p = StreamParser::default();
    let r = run(
        &mut p,
        &[r#"{"choices":[{"index":0,"delta":{"content":"par"}}]}"#],
    );
    assert!(matches!(r, Err(ModelError::Transport { .. })));
}

#[test]
fn error_chunk_is_classified() {
    let mut p = StreamParser::default();
    let r = p.on_event(
        "message",
        r#"{"error":{"code":"context_length_exceeded","message":"too long"}}"#,
    );
    assert!(matches!(r, Err(ModelError::ContextOverflow { .. })));
}

#[test]
fn non_streamed_response() -> Result<(), ModelError> {
    let events = parse_response(&json!({
        "choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": "partial",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "t", "arguments": "{oops"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}
    }))?;
    assert_eq!(
        events,
        vec![
            ModelEvent::TextDelta("partial".into()),
            ModelEvent::ToolCallStart {
                index: 0,
                id: "a".into(),
                name: "t".into()
            },
            ModelEvent::ToolCallDelta {
                index: 0,
                arguments: "{oops".into()
            },
            ModelEvent::Usage(Usage {
                input_tokens: 3,
                output_tokens: 2,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            }),
            ModelEvent::Stop(StopReason::MaxTokens),
        ]
    );
    assert!(parse_response(&json!({"choices": []})).is_err());
    Ok(())
}

#[test]
fn from_env_reads_through_the_lookup() {
    let env = |k: &str| match k {
        "OPENAI_BASE_URL" => Some("http://h:1/v1".to_owned()),
        "OPENAI_API_KEY" => Some("sk-x".to_owned()),
        _ => None,
    };
    let c = OpenAiConfig::from_env("gpt-4o-mini", &env);
    assert_eq!(c.base_url, "http://h:1/v1");
    assert_eq!(c.api_key.as_deref(), Some("sk-x"));
    assert_eq!(c.context_window, 128_000);
    assert!(!format!("{c:?}").contains("sk-x"));
    let none = OpenAiConfig::from_env("m", &|_| None);
    assert_eq!(none.base_url, OPENAI_DEFAULT_BASE_URL);
    assert_eq!(none.api_key, None);
}

proptest::proptest! {
    /// However the server splits the arguments, the assembled call is the same text.
    #[test]
    fn any_split_of_arguments_reassembles(args in "[ -~]{0,60}", cuts in proptest::collection::vec(0usize..60, 0..6)) {
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < args.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::new();
        let mut start = 0;
        for c in cuts.into_iter().chain([args.len()]) {
            pieces.push(&args[start..c]);
            start = c;
        }
        let mut lines = vec![json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"t","arguments":""}}]}}]}).to_string()];
        for p in &pieces {
            lines.push(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":p}}]}}]}).to_string());
        }
        lines.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.to_owned());
        lines.push("[DONE]".to_owned());
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let events = run(&mut StreamParser::default(), &refs).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
        let mut asm = ResponseAssembler::default();
        events.iter().for_each(|e| asm.push(e));
        let calls: Vec<ToolCall> = asm.finish().message.tool_calls().cloned().collect();
        proptest::prop_assert_eq!(calls, vec![ToolCall { id: "c".into(), name: "t".into(), arguments: args.clone() }]);
    }
}

/// A user message with images: its content is a list of parts, each image an inline
/// `data:` URL with the block's exact data; a text-only message keeps the plain string.
#[test]
fn a_user_message_with_images_is_sent_as_parts() -> Result<(), serde_json::Error> {
    let image = |mt: &str, data: &str| {
        ContentBlock::Image(hame_core::ImageBlock {
            media_type: mt.into(),
            data: data.into(),
        })
    };
    let req = ModelRequest {
        system: String::new(),
        messages: vec![
            Message {
                role: Role::User,
                content: vec![
                    ContentBlock::Text {
                        text: "compare these".into(),
                    },
                    image("image/png", "iVBORw0KGgo="),
                    image("image/webp", "UklGRg=="),
                ]
                .into(),
                usage: None,
            },
            Message::assistant("the first is a PNG"),
            Message {
                role: Role::User,
                content: vec![image("image/jpeg", "/9j/4A==")].into(),
                usage: None,
            },
        ],
        tools: Vec::new(),
        params: ModelParams::default(),
        cache_key: None,
    };
    let body = serde_json::to_value(request_body(&OpenAiConfig::new("m"), &req, false))?;
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "compare these"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "data:image/webp;base64,UklGRg=="}}
            ]},
            {"role": "assistant", "content": "the first is a PNG"},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4A=="}}
            ]}
        ])
    );
    Ok(())
}
