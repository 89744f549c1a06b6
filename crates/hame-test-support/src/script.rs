//! Script steps: what the server answers to one request.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Token figures reported by a scripted reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptUsage {
    /// Prompt tokens (including cached ones).
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
}

/// One tool call of a scripted reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptToolCall {
    /// Call id (`call_…` for OpenAI, `toolu_…` for Anthropic; any string works).
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments exactly as sent on the wire; may be malformed JSON on purpose. In a
    /// script file either a JSON string (sent verbatim) or a JSON object (sent as its
    /// JSON text): `"arguments": {"path": "."}` and `"arguments": "{\"path\":\".\"}"`
    /// are the same call.
    #[serde(deserialize_with = "arguments_text")]
    pub arguments: String,
}

/// Tool-call arguments of a script file: a string verbatim, any other value as JSON text.
fn arguments_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s,
        other => other.to_string(),
    })
}

impl ScriptToolCall {
    /// A call whose arguments are the JSON text of `arguments`.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: &Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
        }
    }

    /// A call with raw argument text, which need not be valid JSON.
    pub fn raw(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

/// Reasoning ("thinking") returned before the answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptReasoning {
    /// The reasoning text.
    pub text: String,
    /// Anthropic signature; OpenAI-style servers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// Why a scripted reply stopped, in provider-neutral words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptStop {
    /// Final answer (`stop` / `end_turn`).
    EndTurn,
    /// Tool calls (`tool_calls` / `tool_use`).
    ToolUse,
    /// Output limit (`length` / `max_tokens`).
    MaxTokens,
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reply {
    /// A successful assistant message.
    Message {
        /// Reasoning before the answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<ScriptReasoning>,
        /// Answer text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// Tool calls, in order (several = parallel calls).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ScriptToolCall>,
        /// Stop reason; derived from `tool_calls` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop: Option<ScriptStop>,
    },
    /// An HTTP error. In `message` and `body` (and in a [`StreamFault`]'s `error`),
    /// `{api_key}` is replaced by the key the
    /// request carried (the `Authorization: Bearer` token, else `x-api-key`) and
    /// `{authorization}` by the whole `Authorization` header, as providers that echo a
    /// refused key do (`Incorrect API key provided: sk-…`).
    Error {
        /// HTTP status.
        status: u16,
        /// Message put into the provider-shaped body when `body` is absent.
        #[serde(default)]
        message: String,
        /// Body sent verbatim: a JSON value, or raw text when it is a JSON string.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<Value>,
        /// Extra response headers (`Retry-After`, ...).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<(String, String)>,
    },
}

/// One scripted answer: a [`Reply`] plus usage and timing.
///
/// Serialisable, so a whole script can live in a JSON file:
/// `{"kind":"message","text":"hi","usage":{"input_tokens":3,"output_tokens":1}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptStep {
    /// What to answer.
    #[serde(flatten)]
    pub reply: Reply,
    /// Usage to report; estimated from the sizes of request and reply when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ScriptUsage>,
    /// Wait this long before sending the response headers.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
    /// Wait this long before each streamed chunk.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub chunk_delay_ms: u64,
    /// Break a streamed reply part-way (streamed requests only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<StreamFault>,
    /// Answer only a request whose system prompt contains this text (the first matching
    /// queued step is used): a parent and its subagents, told apart by their prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_system: Option<String>,
}

/// How a streamed reply breaks after some chunks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamFault {
    /// Chunks (SSE events) sent before the fault.
    pub after_chunks: usize,
    /// Error object sent as the last event (OpenAI `data: {"error":…}`, Anthropic
    /// `event: error`); when absent the connection just closes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<Reply> for ScriptStep {
    fn from(reply: Reply) -> Self {
        Self {
            reply,
            usage: None,
            delay_ms: 0,
            chunk_delay_ms: 0,
            fault: None,
            when_system: None,
        }
    }
}

impl ScriptStep {
    fn message(
        reasoning: Option<ScriptReasoning>,
        text: Option<String>,
        tool_calls: Vec<ScriptToolCall>,
    ) -> Self {
        Reply::Message {
            reasoning,
            text,
            tool_calls,
            stop: None,
        }
        .into()
    }

    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self::message(None, Some(text.into()), Vec::new())
    }

    /// One tool call with JSON arguments.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self::tool_calls(vec![ScriptToolCall::new(id, name, &arguments)])
    }

    /// Several tool calls in one reply (parallel calls).
    pub fn tool_calls(calls: Vec<ScriptToolCall>) -> Self {
        Self::message(None, None, calls)
    }

    /// A tool call whose arguments are not valid JSON.
    pub fn malformed_tool_call(id: impl Into<String>, name: impl Into<String>) -> Self {
        Self::tool_calls(vec![ScriptToolCall::raw(id, name, r#"{"path": "a.txt",,"#)])
    }

    /// Reasoning followed by a text answer.
    pub fn reasoning(
        reasoning: impl Into<String>,
        signature: Option<&str>,
        text: impl Into<String>,
    ) -> Self {
        Self::message(
            Some(ScriptReasoning {
                text: reasoning.into(),
                signature: signature.map(str::to_owned),
            }),
            Some(text.into()),
            Vec::new(),
        )
    }

    /// An HTTP error with a provider-shaped body carrying `message`.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Reply::Error {
            status,
            message: message.into(),
            body: None,
            headers: Vec::new(),
        }
        .into()
    }

    /// An HTTP error with a verbatim JSON body.
    pub fn error_body(status: u16, body: Value) -> Self {
        Reply::Error {
            status,
            message: String::new(),
            body: Some(body),
            headers: Vec::new(),
        }
        .into()
    }

    /// A web page (`text/html`) with `status` and `<title>title</title>` and 60 lines of
    /// markup: what a web server that is not a model answers.
    pub fn html_page(status: u16, title: &str) -> Self {
        let lines: String = (0..60).map(|i| format!("<p>line {i}</p>\n")).collect();
        let page = format!(
            "<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n{lines}</body></html>\n"
        );
        Self::error_body(status, Value::String(page))
            .with_header("content-type", "text/html; charset=utf-8")
    }

    /// 429 with `Retry-After: <seconds>`.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        Self::error(429, "Rate limit reached, please slow down")
            .with_header("retry-after", retry_after_secs.to_string())
    }

    /// 401 invalid key.
    pub fn unauthorized() -> Self {
        Self::error(401, "Incorrect API key provided")
    }

    /// 401 whose message echoes the key the request carried, as OpenAI-compatible servers
    /// do: `Incorrect API key provided: <key>` (and the whole `Authorization` header).
    pub fn unauthorized_echoing_key() -> Self {
        Self::error(
            401,
            "Incorrect API key provided: {api_key}. You sent `Authorization: {authorization}`.",
        )
    }

    /// The body OpenAI sends when the prompt exceeds the context window (status 400).
    pub fn openai_context_overflow() -> Self {
        Self::error_body(
            400,
            json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded"
            }}),
        )
    }

    /// The body Anthropic sends when the prompt exceeds the context window (status 400).
    pub fn anthropic_context_overflow() -> Self {
        Self::error_body(
            400,
            json!({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum"
            }}),
        )
    }

    /// The body DashScope (Qwen, OpenAI-compatible mode) sends on overflow (status 400).
    pub fn dashscope_context_overflow() -> Self {
        Self::error_body(
            400,
            json!({
                "error": {
                    "code": "invalid_parameter_error",
                    "param": null,
                    "message": "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 129024]",
                    "type": "invalid_request_error"
                },
                "id": "chatcmpl-0d1e2f",
                "request_id": "0d1e2f3a-0000-4000-8000-000000000000"
            }),
        )
    }

    /// The body of DashScope's native API on overflow (status 400).
    pub fn dashscope_native_context_overflow() -> Self {
        Self::error_body(
            400,
            json!({
                "code": "InvalidParameter",
                "message": "Range of input length should be [1, 30720]",
                "request_id": "0d1e2f3a-0000-4000-8000-000000000001"
            }),
        )
    }

    /// Adds a response header (error replies only).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        if let Reply::Error { headers, .. } = &mut self.reply {
            headers.push((name.into(), value.into()));
        }
        self
    }

    /// Adds answer text before the tool calls.
    pub fn with_text(mut self, new: impl Into<String>) -> Self {
        if let Reply::Message { text, .. } = &mut self.reply {
            *text = Some(new.into());
        }
        self
    }

    /// Overrides the stop reason.
    pub fn with_stop(mut self, new: ScriptStop) -> Self {
        if let Reply::Message { stop, .. } = &mut self.reply {
            *stop = Some(new);
        }
        self
    }

    /// Reports these usage figures.
    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.usage = Some(ScriptUsage {
            input_tokens,
            output_tokens,
            cached_input_tokens: 0,
        });
        self
    }

    /// Reports these usage figures, with cached prompt tokens.
    pub fn with_cached_usage(mut self, usage: ScriptUsage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Answers only a request whose system prompt contains `text`.
    pub fn when_system(mut self, text: impl Into<String>) -> Self {
        self.when_system = Some(text.into());
        self
    }

    /// Waits before sending the response headers.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay_ms = duration_ms(delay);
        self
    }

    /// Closes the stream after `chunks` events, without the end marker.
    pub fn cut_after(mut self, chunks: usize) -> Self {
        self.fault = Some(StreamFault {
            after_chunks: chunks,
            error: None,
        });
        self
    }

    /// Sends `error` as an in-stream error event after `chunks` events, then closes.
    pub fn error_after(mut self, chunks: usize, error: Value) -> Self {
        self.fault = Some(StreamFault {
            after_chunks: chunks,
            error: Some(error),
        });
        self
    }

    /// Waits before each streamed chunk.
    pub fn with_chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay_ms = duration_ms(delay);
        self
    }
}

/// A whole script: steps answered in order, then an optional fallback answered forever.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Script {
    /// Steps, first answered first.
    #[serde(default)]
    pub steps: Vec<ScriptStep>,
    /// Answer used when the steps are used up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<ScriptStep>,
}

impl Script {
    /// Parses a script file: either `{"steps": [...], "fallback": {...}}` or a bare array of steps.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        let value: Value = serde_json::from_str(text)?;
        if value.is_array() {
            Ok(Script {
                steps: serde_json::from_value(value)?,
                fallback: None,
            })
        } else {
            serde_json::from_value(value)
        }
    }
}
