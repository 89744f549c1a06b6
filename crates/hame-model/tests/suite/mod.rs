//! Shared helpers.

mod anthropic;
mod diagnostics;
mod endpoints;
mod errors;
mod images;
mod open;
mod openai;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hame_core::{
    Message, Model, ModelError, ModelEvent, ModelRequest, ModelResponse, ResponseAssembler,
    StopReason, ToolSpec, Usage,
};
use hame_model::{AnthropicConfig, AnthropicModel, OpenAiConfig, OpenAiModel, RetryConfig};
use hame_test_support::ScriptedServer;
use serde_json::json;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Retries without real waiting.
pub fn fast_retry(max_retries: usize) -> RetryConfig {
    RetryConfig {
        max_retries,
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        jitter: true,
        max_retry_after: Duration::from_secs(60),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OpenAi,
    Anthropic,
}

pub const BOTH: [Kind; 2] = [Kind::OpenAi, Kind::Anthropic];

pub fn openai_config(server: &ScriptedServer) -> OpenAiConfig {
    OpenAiConfig {
        base_url: server.base_url(),
        api_key: Some("sk-test".into()),
        retry: fast_retry(3),
        ..OpenAiConfig::new("gpt-4o-mini")
    }
}

pub fn anthropic_config(server: &ScriptedServer) -> AnthropicConfig {
    AnthropicConfig {
        base_url: server.url(),
        api_key: Some("sk-ant-test".into()),
        retry: fast_retry(3),
        // The wire shape without breakpoints; `anthropic::prompt_caching_*` turns them on.
        prompt_cache: false,
        ..AnthropicConfig::new("claude-sonnet-4-5")
    }
}

/// A model of `kind` against `server` with a given retry policy and timeout.
pub fn model(
    kind: Kind,
    server: &ScriptedServer,
    retry: RetryConfig,
    timeout: Duration,
) -> Result<Arc<dyn Model>, ModelError> {
    Ok(match kind {
        Kind::OpenAi => Arc::new(OpenAiModel::new(OpenAiConfig {
            retry,
            timeout,
            ..openai_config(server)
        })?),
        Kind::Anthropic => Arc::new(AnthropicModel::new(AnthropicConfig {
            retry,
            timeout,
            ..anthropic_config(server)
        })?),
    })
}

pub fn default_model(kind: Kind, server: &ScriptedServer) -> Result<Arc<dyn Model>, ModelError> {
    model(kind, server, fast_retry(3), Duration::from_secs(30))
}

pub fn ls_tool() -> ToolSpec {
    ToolSpec {
        name: "ls".into(),
        description: "List a directory".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}).into(),
    }
}

pub fn request(text: &str) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![Message::user(text)],
        tools: vec![ls_tool()],
        params: Default::default(),
        cache_key: None,
    }
}

/// Streams a request and returns every event.
pub async fn stream_events(
    model: &dyn Model,
    req: ModelRequest,
) -> Result<Vec<ModelEvent>, ModelError> {
    let mut s = model.stream(req).await?;
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        out.push(ev?);
    }
    Ok(out)
}

pub fn assemble(events: &[ModelEvent]) -> ModelResponse {
    let mut asm = ResponseAssembler::default();
    events.iter().for_each(|e| asm.push(e));
    asm.finish()
}

/// The streamed `events` assemble into the text `text`, the end of the model's turn, with
/// `input`, `output` and `cached` input tokens (none written to the cache).
pub fn assert_text_reply(
    events: &[ModelEvent],
    text: &str,
    (input, output, cached): (u64, u64, u64),
) {
    let r = assemble(events);
    pretty_assertions::assert_eq!(r.message.text_content(), text);
    pretty_assertions::assert_eq!(r.stop_reason, Some(StopReason::EndTurn));
    pretty_assertions::assert_eq!(
        r.usage,
        Some(Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            cache_write_input_tokens: 0,
        })
    );
}
