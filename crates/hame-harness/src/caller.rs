//! What an API caller adds to one call: its own instructions, tools that the caller runs
//! itself (client tools), sampling parameters, a reply format, and the earlier messages of
//! a conversation that a new session starts from.
//!
//! The gateway's OpenAI-compatible routes put a [`CallerRequest`] into the call's
//! [`RuntimeContext::extras`] under [`CALLER_EXTRA`]; two layers of every
//! [`HarnessAgent`](crate::HarnessAgent) act on it (without it they do nothing):
//!
//! - the history layer (outside `session-log`, so the messages are recorded): when the
//!   session has no messages yet, the [`CallerRequest::history`] joins the conversation
//!   before the call's own message;
//! - the caller layer (inside `workspace-context`, so it sees the final system prompt, and
//!   outside `permissions`, so a client tool never reaches hame's tools):
//!   - the system prompt gets a `## Caller instructions` section (the caller's text,
//!     verbatim) and, with a [`ReplyFormat`], a `## Reply format` section;
//!   - the client tools are offered next to hame's; a call to one is suspended with the
//!     layer name [`CLIENT_TOOLS_LAYER`] (durably, like an approval) and resumed with
//!     `{"output": "<text>"}` (optionally `"is_error": true`): that text is the tool's
//!     result;
//!   - `temperature` / `max_tokens` replace the agent's for the call's requests;
//!   - a final reply that does not match the [`ReplyFormat`] is answered once more by the
//!     model (one repair request, not recorded: only the repaired reply joins the
//!     conversation).

use async_trait::async_trait;
use hame_core::{
    AppendNext, CallCtx, ContentBlock, ImageBlock, Layer, Message, ModelNext, ModelRequest,
    ModelResponse, Result, Role, RuntimeContext, Suspension, ToolCall, ToolCtx, ToolError,
    ToolNext, ToolOutcome, ToolSpec,
};
use serde::{Deserialize, Serialize};

pub use crate::caller_schema::{SchemaError, check_schema, validate};

/// Key of [`RuntimeContext::extras`] holding a [`CallerRequest`].
pub const CALLER_EXTRA: &str = "hame.caller";

/// The [`Suspension::layer`] of a client tool call; its resolution is
/// `{"output": "<text>", "is_error": false}`.
pub const CLIENT_TOOLS_LAYER: &str = "client-tools";

/// What a caller adds to one call; see the [module docs](self).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CallerRequest {
    /// The caller's instructions: a `## Caller instructions` section of the system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Tools the caller runs itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// Client tools whose arguments must match their schema (OpenAI's `strict: true`): a
    /// call that does not is answered to the model as `invalid_arguments`, not returned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strict_tools: Vec<String>,
    /// No tool is offered to the model (OpenAI's `tool_choice: "none"`), hame's neither.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_tools: bool,
    /// Sampling temperature for this call's model requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Output token limit for this call's model requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The format the final reply must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_format: Option<ReplyFormat>,
    /// Earlier messages: the start of the conversation when the session has none yet
    /// (ignored otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
}

/// The format of a final reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ReplyFormat {
    /// One JSON object.
    JsonObject,
    /// One JSON value matching a JSON Schema (the subset [`check_schema`] accepts).
    JsonSchema {
        /// The schema's name (for the prompt).
        name: String,
        /// The schema.
        schema: serde_json::Value,
    },
}

impl ReplyFormat {
    /// The JSON value of `text`, when it has the format: the text (or the one fenced
    /// block it consists of) parses and matches; else what is wrong, for the model.
    pub fn check(&self, text: &str) -> std::result::Result<serde_json::Value, String> {
        let body = strip_fence(text);
        let value: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| format!("the reply is not one JSON value ({e})"))?;
        match self {
            ReplyFormat::JsonObject if value.is_object() => Ok(value),
            ReplyFormat::JsonObject => Err("the reply is JSON but not an object".into()),
            ReplyFormat::JsonSchema { schema, .. } => {
                validate(schema, &value).map_err(|errors| {
                    let shown: Vec<String> =
                        errors.iter().take(10).map(|e| e.to_string()).collect();
                    format!("the reply does not match the schema: {}", shown.join("; "))
                })?;
                Ok(value)
            }
        }
    }

    fn prompt_section(&self) -> String {
        match self {
            ReplyFormat::JsonObject => "## Reply format\n\nEnd the task with a final reply that is one JSON object and nothing else (no prose, no code fence).".to_owned(),
            ReplyFormat::JsonSchema { name, schema } => format!(
                "## Reply format\n\nEnd the task with a final reply that is one JSON value and nothing else (no prose, no code fence), matching this JSON Schema (`{name}`):\n\n{schema}"
            ),
        }
    }
}

/// `text` without surrounding whitespace, or the inside of the one ```` ``` ```` fenced
/// block it consists of: the JSON body of a reply in a [`ReplyFormat`].
pub fn strip_fence(text: &str) -> &str {
    let t = text.trim();
    if let Some(rest) = t.strip_prefix("```")
        && let Some(inner) = rest.strip_suffix("```")
    {
        let inner = inner.strip_prefix("json").unwrap_or(inner);
        return inner.trim();
    }
    t
}

impl CallerRequest {
    /// The request of a call, when its context has one (a malformed one counts as none,
    /// with a warning).
    pub fn of(ctx: &RuntimeContext) -> Option<Self> {
        let v = ctx.extras.get(CALLER_EXTRA)?;
        match serde_json::from_value(v.clone()) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed caller request");
                None
            }
        }
    }

    /// `ctx` with this request.
    pub fn into_context(self, mut ctx: RuntimeContext) -> RuntimeContext {
        if let Ok(v) = serde_json::to_value(self) {
            ctx.extras.insert(CALLER_EXTRA.to_owned(), v);
        }
        ctx
    }

    /// With instructions.
    pub fn with_instructions(mut self, text: Option<String>) -> Self {
        self.instructions = text;
        self
    }

    /// With client tools; `strict` names those whose arguments are checked.
    pub fn with_tools(mut self, tools: Vec<ToolSpec>, strict: Vec<String>) -> Self {
        self.tools = tools;
        self.strict_tools = strict;
        self
    }

    /// Without any tool offered to the model.
    pub fn with_no_tools(mut self, none: bool) -> Self {
        self.no_tools = none;
        self
    }

    /// With sampling parameters.
    pub fn with_params(mut self, temperature: Option<f32>, max_tokens: Option<u32>) -> Self {
        self.temperature = temperature;
        self.max_tokens = max_tokens;
        self
    }

    /// With a reply format.
    pub fn with_reply_format(mut self, format: Option<ReplyFormat>) -> Self {
        self.reply_format = format;
        self
    }

    /// With earlier messages.
    pub fn with_history(mut self, history: Vec<Message>) -> Self {
        self.history = history;
        self
    }

    fn is_client_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }

    /// For a strict client tool: whether the call's arguments match its schema.
    fn check_arguments(&self, call: &ToolCall) -> std::result::Result<(), String> {
        if !self.strict_tools.contains(&call.name) {
            return Ok(());
        }
        let Some(spec) = self.tools.iter().find(|t| t.name == call.name) else {
            return Ok(());
        };
        let args = call
            .parse_arguments()
            .map_err(|e| format!("the arguments are not JSON ({e})"))?;
        validate(&spec.parameters, &args).map_err(|errors| {
            let shown: Vec<String> = errors.iter().take(10).map(ToString::to_string).collect();
            format!(
                "the arguments do not match the tool's schema: {}",
                shown.join("; ")
            )
        })
    }
}

/// The text of a client tool's result from its resolution `{"output", "is_error"}`.
fn client_output(value: &serde_json::Value) -> hame_core::ToolOutput {
    let text = match &value["output"] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    if value["is_error"] == true {
        Err(ToolError::new(hame_core::codes::FAILED, text))
    } else {
        Ok(text)
    }
}

/// Seeds a new session with [`CallerRequest::history`]; see the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct HistoryLayer;

#[async_trait]
impl Layer for HistoryLayer {
    fn name(&self) -> &str {
        "caller-history"
    }

    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<()> {
        if cx.state.messages.is_empty()
            && cx.state.pending.is_none()
            && let Some(req) = CallerRequest::of(cx.runtime)
        {
            for m in req.history {
                next.run(cx, hame_core::secrets::redact_message(m)).await?;
            }
        }
        next.run(cx, message).await
    }
}

/// Instructions, client tools, parameters and the reply format of a caller; see the
/// [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct CallerLayer;

#[async_trait]
impl Layer for CallerLayer {
    fn name(&self) -> &str {
        "caller"
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse> {
        let Some(req) = CallerRequest::of(cx.runtime) else {
            return next.run(cx, request).await;
        };
        if let Some(text) = req.instructions.as_deref().filter(|t| !t.trim().is_empty()) {
            request.system.push_str("\n\n## Caller instructions\n\n");
            request.system.push_str(text);
        }
        if let Some(format) = &req.reply_format {
            request.system.push_str("\n\n");
            request.system.push_str(&format.prompt_section());
        }
        request.tools.extend(req.tools.iter().cloned());
        if req.no_tools {
            request.tools.clear();
        }
        if req.temperature.is_some() {
            request.params.temperature = req.temperature;
        }
        if req.max_tokens.is_some() {
            request.params.max_tokens = req.max_tokens;
        }
        let response = next.run(cx, request.clone()).await?;
        let Some(format) = &req.reply_format else {
            return Ok(response);
        };
        if response.message.has_tool_calls() {
            return Ok(response);
        }
        let text = response.message.text_content();
        let Err(problem) = format.check(&text) else {
            return Ok(response);
        };
        // One repair request: the bad reply and what is wrong with it, not recorded.
        tracing::debug!(%problem, "reply format: one repair request");
        request.messages.push(response.message.clone());
        request.messages.push(Message::user(format!(
            "Your reply does not have the required format: {problem}. Reply again with only the JSON value."
        )));
        let repaired = next.run(cx, request).await?;
        Ok(merge_usage(repaired, response.usage))
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        if let Some(r) = cx.resumed_for(CLIENT_TOOLS_LAYER) {
            return ToolOutcome::Done(client_output(&r.resolution.value));
        }
        match CallerRequest::of(&cx.tool.runtime) {
            Some(req) if req.is_client_tool(&call.name) => {
                if let Err(problem) = req.check_arguments(&call) {
                    return ToolOutcome::Done(Err(ToolError::invalid_arguments(problem)));
                }
                ToolOutcome::Suspend(Suspension::new(
                    CLIENT_TOOLS_LAYER,
                    format!("`{}` is run by the caller", call.name),
                ))
            }
            _ => next.run(cx, call).await,
        }
    }
}

fn merge_usage(mut response: ModelResponse, earlier: Option<hame_core::Usage>) -> ModelResponse {
    if let Some(u) = earlier {
        let mut total = response.usage.unwrap_or_default();
        total.add(&u);
        response.usage = Some(total);
    }
    response
}

/// The user messages of a conversation that carry text or images (not tool results), in
/// order: each one's text and its images. Two conversations whose user turns compare
/// equal sent the same words and the same image bytes.
pub fn user_turns(messages: &[Message]) -> Vec<(String, Vec<&ImageBlock>)> {
    messages
        .iter()
        .filter(|m| m.role == Role::User)
        .filter(|m| {
            m.content
                .iter()
                .any(|b| matches!(b, ContentBlock::Text { .. } | ContentBlock::Image(_)))
        })
        .map(|m| (m.text_content(), m.images().collect()))
        .collect()
}

#[cfg(test)]
#[path = "caller_tests.rs"]
mod tests;
