//! Anthropic Messages API (feature `anthropic`).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use hame_core::{
    ContentBlock, Message, Model, ModelError, ModelEvent, ModelInfo, ModelRequest, ModelResponse,
    ModelStream, Role, StopReason, Usage,
};
use serde::Serialize;
use serde_json::{Value, json};

use crate::classify::classify_stream_error;
use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_TIMEOUT, RetryConfig,
    context_window_for,
};
use crate::endpoint::join;
use crate::http::{Client, Common, SseParser, common_of, env_value};

/// Default base URL.
pub const ANTHROPIC_DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Default `max_tokens` (the API requires one).
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 8_192;

/// Configuration of an [`AnthropicModel`].
#[derive(Clone, PartialEq, Eq)]
pub struct AnthropicConfig {
    /// Base URL; `/v1/messages` is appended (only `/messages` when it already ends in
    /// `/v1`). User and password in the URL are sent as basic auth and never shown in
    /// messages. Default `https://api.anthropic.com`.
    pub base_url: String,
    /// Where the base URL comes from, named in connection and URL errors. Default
    /// `ANTHROPIC_BASE_URL`.
    pub base_url_name: String,
    /// `x-api-key`; `None` sends no key (proxies that add their own).
    pub api_key: Option<String>,
    /// Where the key comes from, named in auth errors. Default `ANTHROPIC_API_KEY`.
    pub api_key_name: String,
    /// Model name sent to the server.
    pub model: String,
    /// Context window in tokens. Default from [`crate::context_window_for`] (200k for `claude-`).
    pub context_window: u64,
    /// `max_tokens` when the request does not set one. Default 8192.
    pub max_tokens: u32,
    /// Extended thinking budget in tokens (`None` = thinking off, the default). Must be
    /// at least 1024 and below `max_tokens`; temperature is not sent while it is on.
    pub thinking_budget: Option<u32>,
    /// Idle timeout: longest wait between two chunks of the response. Default 120 s.
    pub timeout: Duration,
    /// Longest wait for a TCP/TLS connection. Default 10 s; not retried.
    pub connect_timeout: Duration,
    /// Longest wait from sending a request (connecting included) until the response
    /// begins (status and headers), retries included. Default 25 s.
    pub first_byte_timeout: Duration,
    /// Retry policy.
    pub retry: RetryConfig,
    /// Prompt caching: `cache_control` breakpoints (at most
    /// [`ANTHROPIC_MAX_CACHE_BREAKPOINTS`]) on the last tool schema, the system prompt and
    /// the last two user turns, so each step reads the previous step's prefix from the
    /// cache. Default on; `false` sends the system prompt as a plain string and no
    /// breakpoints.
    pub prompt_cache: bool,
}

/// The most `cache_control` breakpoints the Messages API takes in one request.
pub const ANTHROPIC_MAX_CACHE_BREAKPOINTS: usize = 4;

impl std::fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("AnthropicConfig");
        self.common().debug_fields(&mut d);
        d.field("max_tokens", &self.max_tokens)
            .field("thinking_budget", &self.thinking_budget)
            .field("prompt_cache", &self.prompt_cache)
            .finish()
    }
}

impl AnthropicConfig {
    /// Defaults for `model` against api.anthropic.com, with no key.
    pub fn new(model: impl Into<String>) -> Self {
        let model = model.into();
        Self {
            base_url: ANTHROPIC_DEFAULT_BASE_URL.to_owned(),
            base_url_name: "ANTHROPIC_BASE_URL".to_owned(),
            api_key: None,
            api_key_name: "ANTHROPIC_API_KEY".to_owned(),
            context_window: context_window_for(&model),
            model,
            max_tokens: ANTHROPIC_DEFAULT_MAX_TOKENS,
            thinking_budget: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            retry: RetryConfig::default(),
            prompt_cache: true,
        }
    }

    /// Reads `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY` through `env`.
    pub fn from_env(model: impl Into<String>, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let mut c = Self::new(model);
        if let Some(url) = env_value(env, &c.base_url_name) {
            c.base_url = url;
        }
        c.api_key = env_value(env, &c.api_key_name);
        c
    }

    fn common(&self) -> Common<'_> {
        common_of!(self, "anthropic")
    }
}

/// A Claude model behind the Messages API.
#[derive(Debug)]
pub struct AnthropicModel {
    config: AnthropicConfig,
    client: Client,
}

impl AnthropicModel {
    /// Builds the client (no request is made).
    ///
    /// # Errors
    /// [`ModelError::Config`] for an empty model name, a bad thinking budget, a base URL
    /// that is not an `http(s)://` URL (the message names
    /// [`AnthropicConfig::base_url_name`]), or a key that cannot be sent in a header.
    pub fn new(config: AnthropicConfig) -> Result<Self, ModelError> {
        if let Some(b) = config.thinking_budget
            && (b < 1024 || b >= config.max_tokens)
        {
            return Err(ModelError::Config(format!(
                "thinking_budget {b} must be at least 1024 and below max_tokens {}",
                config.max_tokens
            )));
        }
        let common = config.common();
        let base = common.base_url()?;
        let path: &[&str] = if base.path().trim_end_matches('/').ends_with("/v1") {
            &["messages"]
        } else {
            &["v1", "messages"]
        };
        let endpoint = join(&base, path);
        let auth = common.api_key.map(|key| ("x-api-key", key.to_owned()));
        let headers = [("anthropic-version", ANTHROPIC_VERSION)];
        let client = Client::new(&common, &base, endpoint, auth, &headers)?;
        Ok(Self { config, client })
    }

    /// The configuration.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    fn max_tokens(&self, request: &ModelRequest) -> u32 {
        request.params.max_tokens.unwrap_or(self.config.max_tokens)
    }
}

#[async_trait]
impl Model for AnthropicModel {
    fn info(&self) -> ModelInfo {
        self.config.common().info()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let body = request_body(&self.config, &request, true);
        let limit = Some(self.max_tokens(&request));
        self.client
            .stream(&body, StreamParser::default(), limit)
            .await
    }

    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = request_body(&self.config, &request, false);
        let limit = Some(self.max_tokens(&request));
        self.client.complete(&body, parse_response, limit).await
    }
}

/// The JSON body of a Messages request. The tool schemas are borrowed from the request:
/// every step sends them all, and a [`Value`] copy of them was built only to be serialised
/// and dropped.
#[derive(Debug, Serialize)]
pub(crate) struct RequestBody<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "System::is_empty")]
    system: System<'a>,
    messages: Vec<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    stream: bool,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Value>,
}

/// The system prompt: a string, or (with prompt caching) one text block carrying a
/// breakpoint.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum System<'a> {
    Text(Cow<'a, str>),
    Blocks([SystemBlock<'a>; 1]),
}

impl System<'_> {
    fn is_empty(&self) -> bool {
        match self {
            System::Text(t) => t.is_empty(),
            System::Blocks([b]) => b.text.is_empty(),
        }
    }
}

#[derive(Debug, Serialize)]
struct SystemBlock<'a> {
    r#type: &'static str,
    text: Cow<'a, str>,
    cache_control: Value,
}

/// The breakpoint every cached prefix ends with (the default five-minute lifetime).
fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// Puts a breakpoint on the last block of the last `n` user turns.
fn mark_user_turns(messages: &mut [Value], n: usize) {
    let turns = messages
        .iter_mut()
        .rev()
        .filter(|m| m["role"] == "user")
        .take(n);
    for m in turns {
        if let Some(last) = m["content"].as_array_mut().and_then(|a| a.last_mut())
            && let Some(block) = last.as_object_mut()
        {
            block.insert("cache_control".to_owned(), ephemeral());
        }
    }
}

#[derive(Debug, Serialize)]
struct Thinking {
    r#type: &'static str,
    budget_tokens: u32,
}

/// Builds the JSON body of a Messages request.
pub(crate) fn request_body<'a>(
    config: &'a AnthropicConfig,
    req: &'a ModelRequest,
    stream: bool,
) -> RequestBody<'a> {
    let mut system = Cow::Borrowed(req.system.as_str());
    let mut messages: Vec<Value> = Vec::new();
    for m in &req.messages {
        if m.role == Role::System {
            let system = system.to_mut();
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&m.text_content());
            continue;
        }
        let (role, blocks) = map_message(m);
        if blocks.is_empty() {
            continue;
        }
        // The API wants user and assistant turns to alternate: merge neighbours.
        match messages.last_mut() {
            Some(last) if last["role"] == role => {
                if let Some(arr) = last["content"].as_array_mut() {
                    arr.extend(blocks);
                }
            }
            _ => messages.push(json!({"role": role, "content": blocks})),
        }
    }
    let cache = config.prompt_cache;
    let mut tools: Vec<WireTool<'a>> = req
        .tools
        .iter()
        .map(|t| WireTool {
            name: &t.name,
            description: &t.description,
            input_schema: &t.parameters,
            cache_control: None,
        })
        .collect();
    let system = if cache && !system.is_empty() {
        System::Blocks([SystemBlock {
            r#type: "text",
            text: system,
            cache_control: ephemeral(),
        }])
    } else {
        System::Text(system)
    };
    if cache {
        // Tools, then the system prompt, then the conversation: each breakpoint caches
        // everything before it. The last two user turns: this step's end, and the previous
        // step's end, which this request reads from the cache.
        let mut used = 0;
        if let Some(last) = tools.last_mut() {
            last.cache_control = Some(ephemeral());
            used += 1;
        }
        if matches!(system, System::Blocks(_)) {
            used += 1;
        }
        mark_user_turns(&mut messages, ANTHROPIC_MAX_CACHE_BREAKPOINTS - used);
    }
    let thinking = config.thinking_budget.map(|budget| Thinking {
        r#type: "enabled",
        budget_tokens: budget,
    });
    RequestBody {
        model: &config.model,
        max_tokens: req.params.max_tokens.unwrap_or(config.max_tokens),
        system,
        messages,
        tools,
        // Extended thinking does not take a temperature.
        temperature: req.params.temperature.filter(|_| thinking.is_none()),
        thinking,
        stream,
    }
}

/// Tool input as an object: malformed or non-object arguments become `{}` (the API rejects
/// anything else; the tool result already told the model what was wrong).
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

fn map_message(m: &Message) -> (&'static str, Vec<Value>) {
    let role = if m.role == Role::Assistant {
        "assistant"
    } else {
        "user"
    };
    let mut blocks = Vec::new();
    // Tool results must come first in a user turn.
    for r in m.tool_results_iter() {
        let mut b = json!({"type": "tool_result", "tool_use_id": r.id, "content": r.content});
        if r.is_error {
            b["is_error"] = json!(true);
        }
        blocks.push(b);
    }
    for b in &m.content {
        match b {
            ContentBlock::Text { text } if !text.is_empty() => {
                blocks.push(json!({"type": "text", "text": text}));
            }
            ContentBlock::Reasoning {
                text,
                signature: Some(sig),
            } if m.role == Role::Assistant => {
                blocks.push(json!({"type": "thinking", "thinking": text, "signature": sig}));
            }
            ContentBlock::ToolCall(c) if m.role == Role::Assistant => {
                blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name,
                                   "input": tool_input(&c.arguments)}));
            }
            ContentBlock::Image(i) if m.role == Role::User => {
                blocks.push(json!({"type": "image", "source": {"type": "base64",
                                   "media_type": i.media_type, "data": i.data}}));
            }
            _ => {}
        }
    }
    (role, blocks)
}

fn stop_reason(s: &str) -> StopReason {
    match s {
        "end_turn" | "stop_sequence" => StopReason::EndTurn,
        "tool_use" => StopReason::ToolUse,
        "max_tokens" => StopReason::MaxTokens,
        other => StopReason::Other(other.to_owned()),
    }
}

/// The usage of a `usage` object: input tokens including cache reads and writes, with the
/// reads and writes also on their own.
fn usage_of(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    let written = n("cache_creation_input_tokens");
    Usage {
        input_tokens: n("input_tokens") + cached + written,
        output_tokens: n("output_tokens"),
        cached_input_tokens: cached,
        cache_write_input_tokens: written,
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn input_text(input: Option<&Value>) -> String {
    match input {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

/// Events of a non-streamed `message` body.
pub(crate) fn parse_response(v: &Value) -> Result<Vec<ModelEvent>, ModelError> {
    if v.get("type").and_then(Value::as_str) == Some("error") {
        return Err(classify_stream_error(&v.to_string()));
    }
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::InvalidResponse(format!("no content in response: {v}")))?;
    hame_core::telemetry::record_response(Some(str_of(v, "model")), Some(str_of(v, "id")));
    let mut events = Vec::new();
    for (index, b) in content.iter().enumerate() {
        match str_of(b, "type") {
            "text" => events.push(ModelEvent::TextDelta(str_of(b, "text").to_owned())),
            "thinking" => {
                events.push(ModelEvent::ReasoningDelta(str_of(b, "thinking").to_owned()));
                let sig = str_of(b, "signature");
                if !sig.is_empty() {
                    events.push(ModelEvent::ReasoningSignature(sig.to_owned()));
                }
            }
            "tool_use" => {
                events.push(ModelEvent::ToolCallStart {
                    index,
                    id: str_of(b, "id").to_owned(),
                    name: str_of(b, "name").to_owned(),
                });
                events.push(ModelEvent::ToolCallDelta {
                    index,
                    arguments: input_text(b.get("input")),
                });
            }
            _ => {}
        }
    }
    if let Some(u) = v.get("usage") {
        events.push(ModelEvent::Usage(usage_of(u)));
    }
    let stop = v
        .get("stop_reason")
        .and_then(Value::as_str)
        .map_or(StopReason::EndTurn, stop_reason);
    events.push(ModelEvent::Stop(stop));
    Ok(events)
}

/// Parses Messages SSE events.
#[derive(Debug, Default)]
pub(crate) struct StreamParser {
    /// The usage of `message_start` (input figures; later events report output).
    start: Usage,
    /// Tool blocks whose `content_block_start` carried a non-empty input.
    prefilled: BTreeSet<u64>,
    stop: Option<StopReason>,
    done: bool,
}

fn index_of(v: &Value) -> u64 {
    v.get("index").and_then(Value::as_u64).unwrap_or(0)
}

fn as_usize(i: u64) -> usize {
    usize::try_from(i).unwrap_or(usize::MAX)
}

impl SseParser for StreamParser {
    fn on_event(&mut self, _event: &str, data: &str) -> Result<Vec<ModelEvent>, ModelError> {
        if data.trim().is_empty() {
            return Ok(Vec::new());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            ModelError::InvalidResponse(format!("stream event is not JSON ({e}): {data}"))
        })?;
        let mut events = Vec::new();
        match str_of(&v, "type") {
            "message_start" => {
                let message = v.get("message").unwrap_or(&Value::Null);
                hame_core::telemetry::record_response(
                    Some(str_of(message, "model")),
                    Some(str_of(message, "id")),
                );
                if let Some(u) = v.pointer("/message/usage") {
                    self.start = usage_of(u);
                    events.push(ModelEvent::Usage(self.start));
                }
            }
            "content_block_start" => {
                let index = index_of(&v);
                let block = v.get("content_block").unwrap_or(&Value::Null);
                match str_of(block, "type") {
                    "tool_use" => {
                        events.push(ModelEvent::ToolCallStart {
                            index: as_usize(index),
                            id: str_of(block, "id").to_owned(),
                            name: str_of(block, "name").to_owned(),
                        });
                        let input = block.get("input");
                        if input.is_some_and(|i| i.as_object().is_none_or(|o| !o.is_empty())) {
                            self.prefilled.insert(index);
                            events.push(ModelEvent::ToolCallDelta {
                                index: as_usize(index),
                                arguments: input_text(input),
                            });
                        }
                    }
                    "text" => {
                        let t = str_of(block, "text");
                        if !t.is_empty() {
                            events.push(ModelEvent::TextDelta(t.to_owned()));
                        }
                    }
                    "thinking" => {
                        let t = str_of(block, "thinking");
                        if !t.is_empty() {
                            events.push(ModelEvent::ReasoningDelta(t.to_owned()));
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let index = index_of(&v);
                let d = v.get("delta").unwrap_or(&Value::Null);
                match str_of(d, "type") {
                    "text_delta" => {
                        events.push(ModelEvent::TextDelta(str_of(d, "text").to_owned()))
                    }
                    "thinking_delta" => {
                        events.push(ModelEvent::ReasoningDelta(str_of(d, "thinking").to_owned()));
                    }
                    "signature_delta" => {
                        events.push(ModelEvent::ReasoningSignature(
                            str_of(d, "signature").to_owned(),
                        ));
                    }
                    "input_json_delta" if !self.prefilled.contains(&index) => {
                        let piece = str_of(d, "partial_json");
                        if !piece.is_empty() {
                            events.push(ModelEvent::ToolCallDelta {
                                index: as_usize(index),
                                arguments: piece.to_owned(),
                            });
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(stop_reason(r));
                }
                if let Some(u) = v.get("usage") {
                    let u = usage_of(u);
                    events.push(ModelEvent::Usage(Usage {
                        input_tokens: self.start.input_tokens.max(u.input_tokens),
                        output_tokens: u.output_tokens,
                        cached_input_tokens: self
                            .start
                            .cached_input_tokens
                            .max(u.cached_input_tokens),
                        cache_write_input_tokens: self
                            .start
                            .cache_write_input_tokens
                            .max(u.cache_write_input_tokens),
                    }));
                }
            }
            "message_stop" => self.done = true,
            "error" => return Err(classify_stream_error(data)),
            _ => {} // ping, content_block_stop, future event types
        }
        Ok(events)
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        if !self.done {
            return Err(ModelError::Transport {
                message: "the stream ended before message_stop".into(),
                source: None,
            });
        }
        Ok(vec![ModelEvent::Stop(
            self.stop.take().unwrap_or(StopReason::EndTurn),
        )])
    }
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
