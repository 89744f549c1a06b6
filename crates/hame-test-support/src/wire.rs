//! Rendering of script steps in the providers' wire formats.

use serde_json::{Value, json};

use crate::script::{ScriptReasoning, ScriptStop, ScriptToolCall, ScriptUsage};

/// The wire format a request asked for, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    OpenAi,
    Anthropic,
}

/// A successful reply, provider-neutral.
#[derive(Debug)]
pub(crate) struct Msg<'a> {
    pub reasoning: Option<&'a ScriptReasoning>,
    pub text: Option<&'a str>,
    pub calls: &'a [ScriptToolCall],
    pub stop: ScriptStop,
    pub usage: ScriptUsage,
    pub model: &'a str,
    pub seq: usize,
}

/// Splits `s` into about `parts` pieces on char boundaries (never empty pieces, at least one).
pub(crate) fn split(s: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(parts.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// Provider-shaped error body for a status and message.
pub(crate) fn error_body(wire: Wire, status: u16, message: &str) -> Value {
    match wire {
        Wire::OpenAi => {
            let (ty, code) = match status {
                401 => ("invalid_request_error", "invalid_api_key"),
                403 => ("invalid_request_error", "permission_denied"),
                429 => ("requests", "rate_limit_exceeded"),
                s if s >= 500 => ("server_error", "server_error"),
                _ => ("invalid_request_error", "invalid_request"),
            };
            json!({"error": {"message": message, "type": ty, "param": null, "code": code}})
        }
        Wire::Anthropic => {
            let ty = match status {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                s if s >= 500 => "api_error",
                _ => "invalid_request_error",
            };
            json!({"type": "error", "error": {"type": ty, "message": message}})
        }
    }
}

fn openai_finish(stop: ScriptStop) -> &'static str {
    match stop {
        ScriptStop::EndTurn => "stop",
        ScriptStop::ToolUse => "tool_calls",
        ScriptStop::MaxTokens => "length",
    }
}

fn anthropic_stop(stop: ScriptStop) -> &'static str {
    match stop {
        ScriptStop::EndTurn => "end_turn",
        ScriptStop::ToolUse => "tool_use",
        ScriptStop::MaxTokens => "max_tokens",
    }
}

fn openai_usage(u: ScriptUsage) -> Value {
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_input_tokens}
    })
}

/// The non-streamed OpenAI `chat.completion` body.
pub(crate) fn openai_body(m: &Msg<'_>) -> Value {
    let mut message = json!({"role": "assistant", "content": m.text});
    if let Some(r) = m.reasoning {
        message["reasoning_content"] = json!(r.text);
    }
    if !m.calls.is_empty() {
        message["tool_calls"] = m
            .calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
    }
    json!({
        "id": format!("chatcmpl-{}", m.seq),
        "object": "chat.completion",
        "created": 1_700_000_000 + m.seq,
        "model": m.model,
        "choices": [{"index": 0, "message": message, "logprobs": null,
                     "finish_reason": openai_finish(m.stop)}],
        "usage": openai_usage(m.usage),
    })
}

/// The streamed OpenAI chunks, each the JSON of one `data:` line (without `[DONE]`).
pub(crate) fn openai_chunks(m: &Msg<'_>, include_usage: bool) -> Vec<Value> {
    let id = format!("chatcmpl-{}", m.seq);
    let created = 1_700_000_000 + m.seq;
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": m.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    };
    let mut out = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    if let Some(r) = m.reasoning {
        for piece in split(&r.text, 2) {
            out.push(chunk(json!({"reasoning_content": piece}), None));
        }
    }
    if let Some(text) = m.text {
        for piece in split(text, 3) {
            out.push(chunk(json!({"content": piece}), None));
        }
    }
    for (index, call) in m.calls.iter().enumerate() {
        out.push(chunk(
            json!({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": ""}}]}),
            None,
        ));
        for piece in split(&call.arguments, 3) {
            out.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    out.push(chunk(json!({}), Some(openai_finish(m.stop))));
    if include_usage {
        out.push(json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": m.model,
            "choices": [], "usage": openai_usage(m.usage),
        }));
    }
    out
}

fn anthropic_usage(u: ScriptUsage) -> Value {
    json!({
        "input_tokens": u.input_tokens.saturating_sub(u.cached_input_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_input_tokens,
        "output_tokens": u.output_tokens,
    })
}

/// Tool input as a JSON value; malformed text is sent as a JSON string.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_owned()))
}

/// The non-streamed Anthropic `message` body.
pub(crate) fn anthropic_body(m: &Msg<'_>) -> Value {
    let mut content = Vec::new();
    if let Some(r) = m.reasoning {
        content.push(json!({"type": "thinking", "thinking": r.text,
                            "signature": r.signature.clone().unwrap_or_default()}));
    }
    if let Some(text) = m.text {
        content.push(json!({"type": "text", "text": text}));
    }
    for c in m.calls {
        content.push(
            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(&c.arguments)}),
        );
    }
    json!({
        "id": format!("msg_{:04}", m.seq),
        "type": "message",
        "role": "assistant",
        "model": m.model,
        "content": content,
        "stop_reason": anthropic_stop(m.stop),
        "stop_sequence": null,
        "usage": anthropic_usage(m.usage),
    })
}

/// The streamed Anthropic events as `(event name, data)`.
pub(crate) fn anthropic_events(m: &Msg<'_>) -> Vec<(&'static str, Value)> {
    let mut start_usage = anthropic_usage(m.usage);
    start_usage["output_tokens"] = json!(1);
    let mut out = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": format!("msg_{:04}", m.seq), "type": "message", "role": "assistant",
                "model": m.model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": start_usage,
            }}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    let mut index = 0usize;
    let delta = |index: usize, delta: Value| {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    };
    let stop = |index: usize| {
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    };
    if let Some(r) = m.reasoning {
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ));
        for piece in split(&r.text, 2) {
            out.push(delta(
                index,
                json!({"type": "thinking_delta", "thinking": piece}),
            ));
        }
        if let Some(sig) = &r.signature {
            out.push(delta(
                index,
                json!({"type": "signature_delta", "signature": sig}),
            ));
        }
        out.push(stop(index));
        index += 1;
    }
    if let Some(text) = m.text {
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in split(text, 3) {
            out.push(delta(index, json!({"type": "text_delta", "text": piece})));
        }
        out.push(stop(index));
        index += 1;
    }
    for c in m.calls {
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        ));
        for piece in split(&c.arguments, 3) {
            out.push(delta(
                index,
                json!({"type": "input_json_delta", "partial_json": piece}),
            ));
        }
        out.push(stop(index));
        index += 1;
    }
    out.push((
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": anthropic_stop(m.stop), "stop_sequence": null},
               "usage": {"output_tokens": m.usage.output_tokens}}),
    ));
    out.push(("message_stop", json!({"type": "message_stop"})));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn split_keeps_all_text() {
        for s in ["", "a", "héllo wörld", "{\"path\":\"a.txt\"}"] {
            let parts = split(s, 3);
            assert_eq!(parts.concat(), s);
            assert!(parts.len() <= 3);
        }
        assert_eq!(split("abcdef", 3), vec!["ab", "cd", "ef"]);
    }
}
