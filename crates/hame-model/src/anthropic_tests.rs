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
        cache_key: Some("hame-0123".into()),
    };
    let config = AnthropicConfig {
        prompt_cache: false,
        ..AnthropicConfig::new("claude-x")
    };
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
    // Prompt caching (the default): breakpoints on the last tool, the system prompt and
    // the last two user turns; the key is OpenAI's and not sent.
    let cached = serde_json::to_value(request_body(&AnthropicConfig::new("claude-x"), &req, true))?;
    let eph = json!({"type": "ephemeral"});
    assert_eq!(
        cached["system"],
        json!([{"type": "text", "text": "be brief", "cache_control": eph}])
    );
    assert_eq!(
        cached["tools"],
        json!([{"name": "ls", "description": "list", "input_schema": {"type": "object"},
                "cache_control": eph}])
    );
    assert_eq!(
        cached["messages"][0]["content"],
        json!([{"type": "text", "text": "list files", "cache_control": eph}])
    );
    assert_eq!(cached["messages"][1], body["messages"][1]);
    assert_eq!(
        cached["messages"][2]["content"][2],
        json!({"type": "text", "text": "thanks", "cache_control": eph})
    );
    assert_eq!(cached.get("prompt_cache_key"), None);
    assert_eq!(breakpoints(&cached), 4);
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

/// The `cache_control` breakpoints anywhere in a body.
fn breakpoints(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Object(o) => {
            usize::from(o.contains_key("cache_control"))
                + o.values().map(breakpoints).sum::<usize>()
        }
        serde_json::Value::Array(a) => a.iter().map(breakpoints).sum(),
        _ => 0,
    }
}

/// However long the conversation and whatever is empty, at most four breakpoints, the
/// last user turn always carries one, and no assistant block does.
#[test]
fn breakpoints_stay_within_the_limit() -> Result<(), serde_json::Error> {
    let config = AnthropicConfig::new("claude-x");
    for turns in 0..6 {
        for (system, tools) in [("", 0), ("sys", 0), ("", 3), ("sys", 3)] {
            let mut messages = Vec::new();
            for i in 0..turns {
                messages.push(Message::user(format!("q{i}")));
                messages.push(Message::assistant(format!("a{i}")));
            }
            messages.push(Message::user("last"));
            let req = ModelRequest {
                system: system.into(),
                messages,
                tools: (0..tools)
                    .map(|i| ToolSpec {
                        name: format!("t{i}"),
                        description: String::new(),
                        parameters: json!({"type": "object"}).into(),
                    })
                    .collect(),
                ..ModelRequest::default()
            };
            let body = serde_json::to_value(request_body(&config, &req, true))?;
            let n = breakpoints(&body);
            assert!(
                n <= ANTHROPIC_MAX_CACHE_BREAKPOINTS,
                "{n} breakpoints: {body}"
            );
            let msgs = body["messages"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            let last = &msgs[msgs.len() - 1];
            assert_eq!(
                last["content"][0]["cache_control"],
                json!({"type": "ephemeral"})
            );
            assert!(
                msgs.iter()
                    .filter(|m| m["role"] == "assistant")
                    .all(|m| breakpoints(m) == 0)
            );
            let used = usize::from(tools > 0) + usize::from(!system.is_empty());
            let expected = used + (turns + 1).min(ANTHROPIC_MAX_CACHE_BREAKPOINTS - used);
            assert_eq!(n, expected);
        }
    }
    Ok(())
}

/// A usage block as api.anthropic.com returns it on a cache hit (recorded), non-streamed
/// and streamed: reads and writes are both part of the input and reported on their own.
#[test]
fn recorded_cache_usage_is_read_back() -> Result<(), ModelError> {
    let recorded = json!({
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Done."}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 21, "cache_creation_input_tokens": 188,
                  "cache_read_input_tokens": 2_959, "output_tokens": 393,
                  "service_tier": "standard",
                  "cache_creation": {"ephemeral_5m_input_tokens": 188, "ephemeral_1h_input_tokens": 0}}
    });
    let expected = Usage {
        input_tokens: 21 + 188 + 2_959,
        output_tokens: 393,
        cached_input_tokens: 2_959,
        cache_write_input_tokens: 188,
    };
    let mut asm = ResponseAssembler::default();
    parse_response(&recorded)?.iter().for_each(|e| asm.push(e));
    assert_eq!(asm.finish().usage, Some(expected));

    let mut p = StreamParser::default();
    let mut asm = ResponseAssembler::default();
    for data in [
        r#"{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"usage":{"input_tokens":21,"cache_creation_input_tokens":188,"cache_read_input_tokens":2959,"output_tokens":1,"service_tier":"standard"}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Done."}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":393}}"#,
        r#"{"type":"message_stop"}"#,
    ] {
        p.on_event("x", data)?.iter().for_each(|e| asm.push(e));
    }
    p.finish()?.iter().for_each(|e| asm.push(e));
    assert_eq!(asm.finish().usage, Some(expected));
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
            cached_input_tokens: 5,
            cache_write_input_tokens: 0,
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
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
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

/// Anthropic's documented cache rules applied to the bodies this client sends: blocks in
/// the order tools, system, messages; at each breakpoint the longest cached prefix ending
/// at that block or up to 20 blocks before it is read; after the request the prefix up to
/// each breakpoint is cached (a write for what was not read). Tokens are estimated at 4
/// characters each. Returns (input tokens, tokens read from the cache) of each request.
struct CacheSim {
    cached: std::collections::HashSet<u64>,
}

impl CacheSim {
    fn request(&mut self, body: &serde_json::Value) -> (u64, u64) {
        use std::hash::{Hash, Hasher};
        let mut blocks: Vec<(String, bool)> = Vec::new();
        let mark = |b: &serde_json::Value| b.get("cache_control").is_some();
        for t in body["tools"].as_array().into_iter().flatten() {
            blocks.push((t.to_string(), mark(t)));
        }
        match &body["system"] {
            serde_json::Value::String(s) => blocks.push((s.clone(), false)),
            serde_json::Value::Array(a) => a
                .iter()
                .for_each(|b| blocks.push((b["text"].to_string(), mark(b)))),
            _ => {}
        }
        for m in body["messages"].as_array().into_iter().flatten() {
            for b in m["content"].as_array().into_iter().flatten() {
                let mut plain = b.clone();
                if let Some(o) = plain.as_object_mut() {
                    o.remove("cache_control");
                }
                blocks.push((format!("{}{}", m["role"], plain), mark(b)));
            }
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut prefix = Vec::new();
        let mut tokens = Vec::new();
        let mut total = 0u64;
        for (text, _) in &blocks {
            text.hash(&mut h);
            prefix.push(h.finish());
            total += (text.len() as u64).div_ceil(4);
            tokens.push(total);
        }
        let mut read = 0;
        for (i, _) in blocks.iter().enumerate().filter(|(_, (_, m))| *m) {
            if let Some(j) = (i.saturating_sub(20)..=i)
                .rev()
                .find(|j| self.cached.contains(&prefix[*j]))
            {
                read = read.max(tokens[j]);
            }
        }
        for (i, _) in blocks.iter().enumerate().filter(|(_, (_, m))| *m) {
            if tokens[i] >= 1_024 {
                self.cached.insert(prefix[i]);
            }
        }
        (total, read)
    }
}

/// Issue #34's measure: over a 200-turn session (a tool step and an answer per turn, every
/// tenth step twelve parallel tool calls, more than the 20 blocks the API looks back over),
/// the share of input tokens billable at the cached rate. Target ≥ 80 %.
#[test]
#[allow(clippy::print_stderr)]
fn cached_share_over_a_200_turn_session() -> Result<(), serde_json::Error> {
    let tools: Vec<ToolSpec> = (0..20)
        .map(|i| ToolSpec {
            name: format!("tool_{i}"),
            description: "does one thing to the workspace and reports it".repeat(3),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}})
                .into(),
        })
        .collect();
    let system = "You are a careful coding agent. ".repeat(250);
    let mut messages: Vec<Message> = Vec::new();
    let (mut input, mut cached) = (0u64, 0u64);
    let mut sim = CacheSim {
        cached: std::collections::HashSet::new(),
    };
    let config = AnthropicConfig::new("claude-sonnet-4-5");
    let mut send = |messages: &[Message], sim: &mut CacheSim| -> Result<(), serde_json::Error> {
        let req = ModelRequest {
            system: system.clone(),
            messages: messages.to_vec(),
            tools: tools.clone(),
            ..ModelRequest::default()
        };
        let (i, c) = sim.request(&serde_json::to_value(request_body(&config, &req, true))?);
        input += i;
        cached += c;
        Ok(())
    };
    for turn in 0..200 {
        messages.push(Message::user(format!(
            "turn {turn}: change the parser so that {}",
            "it accepts more input; ".repeat(8)
        )));
        send(&messages, &mut sim)?;
        let calls = if turn % 10 == 9 { 12 } else { 1 };
        let call_blocks: Vec<ContentBlock> = (0..calls)
            .map(|c| {
                ContentBlock::ToolCall(ToolCall {
                    id: format!("toolu_{turn}_{c}"),
                    name: "tool_1".into(),
                    arguments: format!("{{\"path\":\"src/file_{c}.rs\"}}"),
                })
            })
            .collect();
        messages.push(Message {
            role: Role::Assistant,
            content: call_blocks.into(),
            usage: None,
        });
        messages.push(Message::tool_results(
            (0..calls)
                .map(|c| ToolResult {
                    id: format!("toolu_{turn}_{c}"),
                    content: format!("fn f{c}() {{}}\n").repeat(40),
                    is_error: false,
                    code: None,
                })
                .collect(),
        ));
        send(&messages, &mut sim)?;
        messages.push(Message::assistant(format!("Done with turn {turn}.")));
    }
    let share = cached as f64 / input as f64;
    eprintln!(
        "cached share over 200 turns / 400 requests: {:.1} % ({cached} of {input} input tokens)",
        share * 100.0
    );
    assert!(share >= 0.8, "cached share {share}");
    Ok(())
}

/// An image of a user message is a `base64` image source with the block's exact data, in
/// the message's order; the cache breakpoint may land on it.
#[test]
fn a_user_image_is_a_base64_source() -> Result<(), serde_json::Error> {
    let req = ModelRequest {
        system: String::new(),
        messages: vec![Message::user_with_images(
            "what is this?",
            vec![hame_core::ImageBlock {
                media_type: "image/gif".into(),
                data: "R0lGODlh".into(),
            }],
        )],
        tools: Vec::new(),
        params: ModelParams::default(),
        cache_key: None,
    };
    let config = AnthropicConfig {
        prompt_cache: false,
        ..AnthropicConfig::new("claude-x")
    };
    let body = serde_json::to_value(request_body(&config, &req, false))?;
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGODlh"}}
        ]}])
    );
    let cached =
        serde_json::to_value(request_body(&AnthropicConfig::new("claude-x"), &req, false))?;
    assert_eq!(
        cached["messages"][0]["content"][1]["cache_control"],
        json!({"type": "ephemeral"})
    );
    Ok(())
}
