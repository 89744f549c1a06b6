//! OpenAI Chat Completions and compatible servers (feature `openai`).

use std::time::Duration;

use async_trait::async_trait;
use hame_core::{
    ContentBlock, Message, Model, ModelError, ModelEvent, ModelInfo, ModelRequest, ModelResponse,
    ModelStream, Role, StopReason, Usage,
};
use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use crate::classify::classify_stream_error;
use crate::config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_TIMEOUT, RetryConfig,
    context_window_for,
};
use crate::endpoint::join;
use crate::http::{Client, Common, SseParser, common_of, env_value};

/// Default base URL.
pub const OPENAI_DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Configuration of an [`OpenAiModel`].
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// Base URL; `/chat/completions` is appended. A URL without a path
    /// (`http://127.0.0.1:8000`) gets `/v1` first, as every OpenAI-compatible server serves
    /// under it. User and password in the URL are sent as basic auth and never shown in
    /// messages. Default `https://api.openai.com/v1`.
    pub base_url: String,
    /// Where the base URL comes from, named in connection and URL errors. Default
    /// `OPENAI_BASE_URL`.
    pub base_url_name: String,
    /// Bearer key; `None` for local servers (Ollama, vLLM, llama.cpp) that need none.
    pub api_key: Option<String>,
    /// Where the key comes from, named in auth errors. Default `OPENAI_API_KEY`.
    pub api_key_name: String,
    /// Provider name reported by [`Model::info`]. Default `openai`.
    pub provider: String,
    /// Model name sent to the server.
    pub model: String,
    /// Context window in tokens. Default from [`crate::context_window_for`].
    pub context_window: u64,
    /// Idle timeout: longest wait between two chunks of the response. Default 120 s.
    pub timeout: Duration,
    /// Longest wait for a TCP/TLS connection. Default 10 s; not retried.
    pub connect_timeout: Duration,
    /// Longest wait from sending a request (connecting included) until the response
    /// begins (status and headers), retries included. Default 25 s.
    pub first_byte_timeout: Duration,
    /// Retry policy.
    pub retry: RetryConfig,
    /// Whether to send the request's [`ModelRequest::cache_key`] as `prompt_cache_key`
    /// (which routes requests with one prefix to one cache). `None`, the default: only to
    /// api.openai.com, since compatible servers may refuse fields they do not know.
    pub prompt_cache_key: Option<bool>,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("OpenAiConfig");
        self.common().debug_fields(&mut d);
        d.finish()
    }
}

impl OpenAiConfig {
    /// Defaults for `model` against api.openai.com, with no key.
    pub fn new(model: impl Into<String>) -> Self {
        let model = model.into();
        Self {
            base_url: OPENAI_DEFAULT_BASE_URL.to_owned(),
            base_url_name: "OPENAI_BASE_URL".to_owned(),
            api_key: None,
            api_key_name: "OPENAI_API_KEY".to_owned(),
            provider: "openai".to_owned(),
            context_window: context_window_for(&model),
            model,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            retry: RetryConfig::default(),
            prompt_cache_key: None,
        }
    }

    /// Reads `OPENAI_BASE_URL` and `OPENAI_API_KEY` through `env`
    /// (pass [`crate::process_env`] for the real environment).
    pub fn from_env(model: impl Into<String>, env: &dyn Fn(&str) -> Option<String>) -> Self {
        Self::from_env_vars(
            model,
            env,
            "OPENAI_BASE_URL",
            "OPENAI_API_KEY",
            OPENAI_DEFAULT_BASE_URL,
        )
    }

    /// Like [`OpenAiConfig::from_env`] with other variable names and default base URL
    /// (DashScope, Ollama, ...).
    pub fn from_env_vars(
        model: impl Into<String>,
        env: &dyn Fn(&str) -> Option<String>,
        base_url_var: &str,
        api_key_var: &str,
        default_base_url: &str,
    ) -> Self {
        let mut c = Self::new(model);
        c.base_url = env_value(env, base_url_var).unwrap_or_else(|| default_base_url.to_owned());
        c.api_key = env_value(env, api_key_var);
        base_url_var.clone_into(&mut c.base_url_name);
        api_key_var.clone_into(&mut c.api_key_name);
        c
    }

    fn common(&self) -> Common<'_> {
        common_of!(self, &self.provider)
    }

    /// Whether `prompt_cache_key` is sent (see [`OpenAiConfig::prompt_cache_key`]).
    pub fn sends_prompt_cache_key(&self) -> bool {
        self.prompt_cache_key
            .unwrap_or_else(|| is_official(&self.base_url))
    }
}

/// Whether a base URL is api.openai.com's.
fn is_official(base_url: &str) -> bool {
    base_url.contains("api.openai.com")
}

/// A chat model behind an OpenAI-compatible `/chat/completions` endpoint.
#[derive(Debug)]
pub struct OpenAiModel {
    config: OpenAiConfig,
    client: Client,
}

impl OpenAiModel {
    /// Builds the client (no request is made).
    ///
    /// # Errors
    /// [`ModelError::Config`] for an empty model name, a base URL that is not an
    /// `http(s)://` URL (the message names [`OpenAiConfig::base_url_name`]), or a key that
    /// cannot be sent in a header.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let common = config.common();
        let mut base = common.base_url()?;
        if base.path() == "/" {
            base.set_path("/v1");
        }
        let endpoint = join(&base, &["chat", "completions"]);
        let auth = common
            .api_key
            .map(|key| ("authorization", format!("Bearer {key}")));
        let client = Client::new(&common, &base, endpoint, auth, &[])?;
        Ok(Self { config, client })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }
}

#[async_trait]
impl Model for OpenAiModel {
    fn info(&self) -> ModelInfo {
        self.config.common().info()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let body = request_body(&self.config, &request, true);
        let limit = request.params.max_tokens;
        self.client
            .stream(&body, StreamParser::default(), limit)
            .await
    }

    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = request_body(&self.config, &request, false);
        let limit = request.params.max_tokens;
        self.client.complete(&body, parse_response, limit).await
    }
}

/// The JSON body of a Chat Completions request. It borrows from the request (the tool
/// schemas, the tool results): every step sends the whole conversation, and building it
/// as a [`Value`] tree deep-copied all of it only to serialise and drop the copy.
#[derive(Debug, Serialize)]
pub(crate) struct RequestBody<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    // api.openai.com's reasoning models only accept the newer name; compatible servers
    // (vLLM, Ollama, DashScope, llama.cpp) all accept the older one.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// One message of the wire conversation. `content` is `null` only for an assistant
/// message that is nothing but tool calls.
#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    content: Option<WireContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCall<'a>>,
}

/// A message's content: a string, or (a user message with images) a list of parts.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<WirePart<'a>>),
}

/// One content part: `{"type": "text", "text"}` or `{"type": "image_url", "image_url":
/// {"url": "data:<media type>;base64,<data>"}}` (hame sends images inline only).
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: WireImageUrl },
}

#[derive(Debug, Serialize)]
struct WireImageUrl {
    url: String,
}

/// The parts of a user message with images, in the message's order.
fn parts_of(m: &Message) -> Vec<WirePart<'_>> {
    m.content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } if !text.is_empty() => Some(WirePart::Text { text }),
            ContentBlock::Image(i) => Some(WirePart::ImageUrl {
                image_url: WireImageUrl {
                    url: format!("data:{};base64,{}", i.media_type, i.data),
                },
            }),
            _ => None,
        })
        .collect()
}

impl<'a> WireMessage<'a> {
    fn new(role: &'static str, content: Cow<'a, str>) -> Self {
        WireMessage {
            role,
            tool_call_id: None,
            content: Some(WireContent::Text(content)),
            tool_calls: Vec::new(),
        }
    }
}

#[derive(Debug, Serialize)]
struct WireCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireCallFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// Builds the JSON body of a Chat Completions request.
pub(crate) fn request_body<'a>(
    config: &'a OpenAiConfig,
    req: &'a ModelRequest,
    stream: bool,
) -> RequestBody<'a> {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if !req.system.is_empty() {
        messages.push(WireMessage::new("system", Cow::Borrowed(&req.system)));
    }
    for m in &req.messages {
        map_message(m, &mut messages);
    }
    let tools = req
        .tools
        .iter()
        .map(|t| WireTool {
            r#type: "function",
            function: WireFunction {
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
            },
        })
        .collect();
    let official = is_official(&config.base_url);
    let max = req.params.max_tokens;
    let prompt_cache_key = req
        .cache_key
        .as_deref()
        .filter(|_| config.sends_prompt_cache_key());
    RequestBody {
        model: &config.model,
        prompt_cache_key,
        messages,
        tools,
        temperature: req.params.temperature,
        max_tokens: max.filter(|_| !official),
        max_completion_tokens: max.filter(|_| official),
        stream,
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
    }
}

/// The text of a message: borrowed when it is one text block (nearly always).
fn text_of(m: &Message) -> Cow<'_, str> {
    let mut texts = m.content.iter().filter_map(|b| match b {
        ContentBlock::Text { text } => Some(text.as_str()),
        _ => None,
    });
    match (texts.next(), texts.next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(only), None) => Cow::Borrowed(only),
        _ => Cow::Owned(m.text_content()),
    }
}

fn map_message<'a>(m: &'a Message, out: &mut Vec<WireMessage<'a>>) {
    let text = text_of(m);
    match m.role {
        Role::System => out.push(WireMessage::new("system", text)),
        Role::Assistant => {
            let calls: Vec<WireCall<'_>> = m
                .tool_calls()
                .map(|c| {
                    let args = if c.arguments.trim().is_empty() {
                        "{}"
                    } else {
                        c.arguments.as_str()
                    };
                    WireCall {
                        id: &c.id,
                        r#type: "function",
                        function: WireCallFunction {
                            name: &c.name,
                            arguments: args,
                        },
                    }
                })
                .collect();
            let content = (!text.is_empty() || calls.is_empty()).then_some(WireContent::Text(text));
            out.push(WireMessage {
                role: "assistant",
                tool_call_id: None,
                content,
                tool_calls: calls,
            });
        }
        Role::User | Role::Tool => {
            for r in m.tool_results_iter() {
                out.push(WireMessage {
                    role: "tool",
                    tool_call_id: Some(&r.id),
                    content: Some(WireContent::Text(Cow::Borrowed(&r.content))),
                    tool_calls: Vec::new(),
                });
            }
            if m.role == Role::User && m.images().next().is_some() {
                out.push(WireMessage {
                    role: "user",
                    tool_call_id: None,
                    content: Some(WireContent::Parts(parts_of(m))),
                    tool_calls: Vec::new(),
                });
            } else if !text.is_empty() || (m.role == Role::User && !m.content.iter().any(is_result))
            {
                out.push(WireMessage::new("user", text));
            }
        }
    }
}

fn is_result(b: &ContentBlock) -> bool {
    matches!(b, ContentBlock::ToolResult(_))
}

fn finish_reason(s: &str) -> StopReason {
    match s {
        "stop" => StopReason::EndTurn,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "length" => StopReason::MaxTokens,
        other => StopReason::Other(other.to_owned()),
    }
}

fn usage(v: &Value) -> Option<Usage> {
    let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    (v.is_object()).then(|| Usage {
        input_tokens: n("/prompt_tokens"),
        output_tokens: n("/completion_tokens"),
        cached_input_tokens: n("/prompt_tokens_details/cached_tokens"),
        cache_write_input_tokens: 0,
    })
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Events of a non-streamed `chat.completion` body.
pub(crate) fn parse_response(v: &Value) -> Result<Vec<ModelEvent>, ModelError> {
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Err(classify_stream_error(&v.to_string()));
    }
    let choice = v
        .pointer("/choices/0")
        .ok_or_else(|| ModelError::InvalidResponse(format!("no choices in response: {v}")))?;
    let msg = choice.get("message").unwrap_or(&Value::Null);
    hame_core::telemetry::record_response(str_of(v, "model"), str_of(v, "id"));
    let mut events = Vec::new();
    if let Some(r) = str_of(msg, "reasoning_content")
        .or_else(|| str_of(msg, "reasoning"))
        .filter(|x| !x.is_empty())
    {
        events.push(ModelEvent::ReasoningDelta(r.to_owned()));
    }
    if let Some(t) = str_of(msg, "content").filter(|x| !x.is_empty()) {
        events.push(ModelEvent::TextDelta(t.to_owned()));
    }
    for (index, call) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        events.push(ModelEvent::ToolCallStart {
            index,
            id: str_of(call, "id").unwrap_or_default().to_owned(),
            name: call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        });
        events.push(ModelEvent::ToolCallDelta {
            index,
            arguments: raw_arguments(call.pointer("/function/arguments")),
        });
    }
    if let Some(u) = v.get("usage").and_then(usage) {
        events.push(ModelEvent::Usage(u));
    }
    let stop = str_of(choice, "finish_reason").map_or(StopReason::EndTurn, finish_reason);
    events.push(ModelEvent::Stop(stop));
    Ok(events)
}

/// Arguments as text: servers send a string; a few send an object.
fn raw_arguments(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Parses `chat.completion.chunk` events.
#[derive(Debug, Default)]
pub(crate) struct StreamParser {
    stop: Option<StopReason>,
    done: bool,
    /// The answering model and response id were recorded on the span.
    recorded: bool,
}

impl SseParser for StreamParser {
    fn on_event(&mut self, _event: &str, data: &str) -> Result<Vec<ModelEvent>, ModelError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            ModelError::InvalidResponse(format!("stream chunk is not JSON ({e}): {data}"))
        })?;
        if v.get("error").is_some_and(|e| !e.is_null()) {
            return Err(classify_stream_error(data));
        }
        if !self.recorded {
            self.recorded = true;
            hame_core::telemetry::record_response(str_of(&v, "model"), str_of(&v, "id"));
        }
        let mut events = Vec::new();
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(r) = str_of(delta, "reasoning_content")
                .or_else(|| str_of(delta, "reasoning"))
                .filter(|x| !x.is_empty())
            {
                events.push(ModelEvent::ReasoningDelta(r.to_owned()));
            }
            if let Some(t) = str_of(delta, "content").filter(|x| !x.is_empty()) {
                events.push(ModelEvent::TextDelta(t.to_owned()));
            }
            for (pos, call) in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .and_then(|i| usize::try_from(i).ok())
                    .unwrap_or(pos);
                let id = str_of(call, "id").unwrap_or_default();
                let name = call
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !id.is_empty() || !name.is_empty() {
                    events.push(ModelEvent::ToolCallStart {
                        index,
                        id: id.to_owned(),
                        name: name.to_owned(),
                    });
                }
                let args = raw_arguments(call.pointer("/function/arguments"));
                if !args.is_empty() {
                    events.push(ModelEvent::ToolCallDelta {
                        index,
                        arguments: args,
                    });
                }
            }
            if let Some(r) = str_of(choice, "finish_reason") {
                self.stop = Some(finish_reason(r));
            }
        }
        if let Some(u) = v.get("usage").and_then(usage) {
            events.push(ModelEvent::Usage(u));
        }
        Ok(events)
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        match self.stop.take() {
            Some(stop) => Ok(vec![ModelEvent::Stop(stop)]),
            None if self.done => Ok(vec![ModelEvent::Stop(StopReason::EndTurn)]),
            None => Err(ModelError::Transport {
                message: "the stream ended before a finish_reason or [DONE]".into(),
                source: None,
            }),
        }
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
