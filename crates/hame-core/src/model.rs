//! The [`Model`] contract: a request gives a stream of [`ModelEvent`]s.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::message::{ContentBlock, Message, Role, ToolCall, Usage};
use crate::tool::ToolSpec;

/// Sampling and length parameters of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelParams {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Maximum output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// One request to a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelRequest {
    /// The system prompt (rebuilt by the harness before every request).
    pub system: String,
    /// The conversation, without the system prompt.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// Parameters.
    pub params: ModelParams,
    /// A stable key of the prompt's prefix: the harness sets one per (agent, user,
    /// session), a hash that names none of them. Providers that route prompt caching by
    /// key receive it (OpenAI `prompt_cache_key`); `None` sends no key.
    pub cache_key: Option<String>,
}

/// The prompt cache key of a call, in its [`Extensions`](crate::Extensions): the loop
/// copies it into every request's [`ModelRequest::cache_key`]. The harness derives it from
/// the agent, user and session ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptCacheKey(pub String);

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A final answer.
    EndTurn,
    /// The model asked for tools.
    ToolUse,
    /// The output hit the token limit.
    MaxTokens,
    /// Anything else the provider reported.
    Other(String),
}

/// An event of a streamed model response.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ModelEvent {
    /// A piece of answer text.
    TextDelta(String),
    /// A piece of reasoning text.
    ReasoningDelta(String),
    /// A reasoning signature (sent back verbatim on the next request).
    ReasoningSignature(String),
    /// A tool call begins at `index`.
    ToolCallStart {
        /// Position of the call in the response.
        index: usize,
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More argument text for the call at `index`.
    ToolCallDelta {
        /// Position of the call in the response.
        index: usize,
        /// The next piece of the JSON arguments.
        arguments: String,
    },
    /// Token usage of the request.
    Usage(Usage),
    /// The response is complete.
    Stop(StopReason),
}

/// A whole model response.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The assistant message (text, reasoning and tool calls).
    pub message: Message,
    /// Usage, when reported.
    pub usage: Option<Usage>,
    /// Why it stopped.
    pub stop_reason: Option<StopReason>,
}

/// Static facts about a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// Provider name (`openai`, `anthropic`, ...).
    pub provider: String,
    /// Model name sent to the provider.
    pub model: String,
    /// Context window in tokens.
    pub context_window: u64,
}

/// A model failure, classified so that callers can branch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The prompt does not fit the model's context window.
    #[error("context overflow: {message}")]
    ContextOverflow {
        /// The provider's message.
        message: String,
    },
    /// Too many requests.
    #[error("rate limited{}: {message}", retry_hint(*retry_after))]
    RateLimited {
        /// The provider's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The key was refused (401/403).
    #[error("authentication failed ({status}): {message}")]
    Auth {
        /// HTTP status.
        status: u16,
        /// What was wrong, including which key.
        message: String,
    },
    /// Any other HTTP error from the provider.
    #[error("provider error ({status}): {body}")]
    Provider {
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
    /// Connection failure, reset or timeout.
    #[error("transport error: {message}")]
    Transport {
        /// What happened.
        message: String,
        /// The cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The provider answered with something this client cannot read.
    #[error("invalid response: {0}")]
    InvalidResponse(String),
    /// The configuration is unusable (missing key, unknown provider, ...).
    #[error("configuration error: {0}")]
    Config(String),
}

impl ModelError {
    /// Whether retrying the same request may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelError::RateLimited { .. } | ModelError::Transport { .. } => true,
            ModelError::Provider { status, .. } => {
                *status >= 500 || *status == 408 || *status == 409
            }
            _ => false,
        }
    }

    /// Whether this is a context overflow the harness can recover from by compacting.
    pub fn is_context_overflow(&self) -> bool {
        matches!(self, ModelError::ContextOverflow { .. })
    }
}

/// ` (retry after 2 s)`, ` (retry after 3 min 5 s)`, or nothing.
fn retry_hint(after: Option<Duration>) -> String {
    let Some(d) = after else {
        return String::new();
    };
    let s = d.as_secs();
    let text = match s {
        0 => format!("{} ms", d.as_millis()),
        1..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    };
    format!(" (retry after {text})")
}

/// A stream of model events.
pub type ModelStream = BoxStream<'static, Result<ModelEvent, ModelError>>;

/// A chat model with tool calling.
#[async_trait]
pub trait Model: Send + Sync + fmt::Debug + 'static {
    /// Static facts about the model.
    fn info(&self) -> ModelInfo;

    /// Sends a request and streams the response.
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError>;

    /// Sends a request and waits for the whole response.
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        let mut stream = self.stream(request).await?;
        let mut asm = ResponseAssembler::default();
        while let Some(ev) = stream.next().await {
            asm.push(&ev?);
        }
        Ok(asm.finish())
    }
}

#[async_trait]
impl<T: Model + ?Sized> Model for Arc<T> {
    fn info(&self) -> ModelInfo {
        (**self).info()
    }
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        (**self).stream(request).await
    }
    async fn complete(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        (**self).complete(request).await
    }
}

/// Builds a [`ModelResponse`] from streamed events; tool-call arguments split across
/// deltas are concatenated per call index.
#[derive(Debug, Default)]
pub struct ResponseAssembler {
    text: String,
    reasoning: String,
    signature: Option<String>,
    calls: Vec<(usize, ToolCall)>,
    usage: Option<Usage>,
    stop: Option<StopReason>,
}

impl ResponseAssembler {
    /// Feeds one event.
    pub fn push(&mut self, event: &ModelEvent) {
        match event {
            ModelEvent::TextDelta(t) => self.text.push_str(t),
            ModelEvent::ReasoningDelta(t) => self.reasoning.push_str(t),
            ModelEvent::ReasoningSignature(s) => self.signature = Some(s.clone()),
            ModelEvent::ToolCallStart { index, id, name } => {
                if let Some((_, c)) = self.calls.iter_mut().find(|(i, _)| i == index) {
                    if !id.is_empty() {
                        c.id.clone_from(id);
                    }
                    if !name.is_empty() {
                        c.name.clone_from(name);
                    }
                } else {
                    self.calls.push((
                        *index,
                        ToolCall {
                            id: id.clone(),
                            name: name.clone(),
                            arguments: String::new(),
                        },
                    ));
                }
            }
            ModelEvent::ToolCallDelta { index, arguments } => {
                if let Some((_, c)) = self.calls.iter_mut().find(|(i, _)| i == index) {
                    c.arguments.push_str(arguments);
                } else {
                    self.calls.push((
                        *index,
                        ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: arguments.clone(),
                        },
                    ));
                }
            }
            ModelEvent::Usage(u) => {
                let total = self.usage.get_or_insert_with(Usage::default);
                // Providers report cumulative figures per request; keep the largest.
                total.input_tokens = total.input_tokens.max(u.input_tokens);
                total.output_tokens = total.output_tokens.max(u.output_tokens);
                total.cached_input_tokens = total.cached_input_tokens.max(u.cached_input_tokens);
                total.cache_write_input_tokens = total
                    .cache_write_input_tokens
                    .max(u.cache_write_input_tokens);
            }
            ModelEvent::Stop(r) => self.stop = Some(r.clone()),
        }
    }

    /// The assembled response.
    pub fn finish(mut self) -> ModelResponse {
        let mut content = Vec::new();
        if !self.reasoning.is_empty() || self.signature.is_some() {
            content.push(ContentBlock::Reasoning {
                text: self.reasoning,
                signature: self.signature,
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::Text { text: self.text });
        }
        self.calls.sort_by_key(|(i, _)| *i);
        for (n, (_, mut call)) in self.calls.into_iter().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_{n}");
            }
            content.push(ContentBlock::ToolCall(call));
        }
        ModelResponse {
            message: Message {
                role: Role::Assistant,
                content: content.into(),
                usage: self.usage,
            },
            usage: self.usage,
            stop_reason: self.stop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn assembles_split_tool_arguments() {
        let mut a = ResponseAssembler::default();
        for ev in [
            ModelEvent::TextDelta("Let me ".into()),
            ModelEvent::TextDelta("look.".into()),
            ModelEvent::ToolCallStart {
                index: 1,
                id: "b".into(),
                name: "ls".into(),
            },
            ModelEvent::ToolCallStart {
                index: 0,
                id: "a".into(),
                name: "read_file".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 0,
                arguments: "{\"pa".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 1,
                arguments: "{}".into(),
            },
            ModelEvent::ToolCallDelta {
                index: 0,
                arguments: "th\":\"x\"}".into(),
            },
            ModelEvent::Usage(Usage {
                input_tokens: 7,
                output_tokens: 0,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            }),
            ModelEvent::Usage(Usage {
                input_tokens: 7,
                output_tokens: 4,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            }),
            ModelEvent::Stop(StopReason::ToolUse),
        ] {
            a.push(&ev);
        }
        let r = a.finish();
        assert_eq!(r.message.text_content(), "Let me look.");
        let calls: Vec<_> = r.message.tool_calls().cloned().collect();
        assert_eq!(
            calls,
            vec![
                ToolCall {
                    id: "a".into(),
                    name: "read_file".into(),
                    arguments: "{\"path\":\"x\"}".into()
                },
                ToolCall {
                    id: "b".into(),
                    name: "ls".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(
            r.usage,
            Some(Usage {
                input_tokens: 7,
                output_tokens: 4,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            })
        );
        assert_eq!(r.stop_reason, Some(StopReason::ToolUse));
    }

    #[test]
    fn retry_classification() {
        assert!(
            ModelError::Provider {
                status: 503,
                body: String::new()
            }
            .is_retryable()
        );
        assert!(
            !ModelError::Provider {
                status: 400,
                body: String::new()
            }
            .is_retryable()
        );
        assert!(
            !ModelError::Auth {
                status: 401,
                message: String::new()
            }
            .is_retryable()
        );
        assert_eq!(
            ModelError::RateLimited {
                retry_after: Some(Duration::from_secs(100_000)),
                message: "slow down".into()
            }
            .to_string(),
            "rate limited (retry after 27 h 46 min): slow down"
        );
        assert!(
            ModelError::RateLimited {
                retry_after: None,
                message: String::new()
            }
            .is_retryable()
        );
        assert!(
            !ModelError::ContextOverflow {
                message: String::new()
            }
            .is_retryable()
        );
    }
}
