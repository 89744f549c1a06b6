//! The spans of a call, named and attributed as the OpenTelemetry GenAI semantic
//! conventions give them (ADR 0037; every attribute in `docs/gateway.md`, "Traces").
//!
//! The spans are plain `tracing` spans (target `hame_core::agent`): a subscriber without
//! OpenTelemetry sees `hame.call`, `hame.step`, `hame.model` and `hame.tool`; the
//! `tracing-opentelemetry` bridge reads the `otel.*` fields for the exported name, kind and
//! status:
//!
//! | span | exported name | kind | attributes |
//! |---|---|---|---|
//! | `hame.call` | `invoke_agent {agent}` | INTERNAL | `gen_ai.operation.name` = `invoke_agent`, `gen_ai.agent.name`, `gen_ai.conversation.id`, `error.type` |
//! | `hame.step` | `hame.step` | INTERNAL | `iteration` |
//! | `hame.model` | `chat {model}` | CLIENT | `gen_ai.operation.name` = `chat`, `gen_ai.provider.name`, `gen_ai.system`, `gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.response.id`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`, `error.type`, `hame.context.manifest` ([`ManifestAttribute`]) |
//! | `hame.tool` | `execute_tool {tool}` | INTERNAL | `gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.type` = `function`, `error.type` |
//!
//! A failed model request, a tool result that is an error and a failed call (not a
//! suspension) get the ERROR status with the error text (at most [`MAX_DESCRIPTION`]
//! bytes) as its description and the stable code as `error.type`. A model client fills
//! `gen_ai.response.model` and `gen_ai.response.id` of the current span from the
//! provider's answer ([`record_response`]).

/// The agent's name on the `invoke_agent` span (`gen_ai.agent.name`); put it in the call's
/// [`Extensions`](crate::Extensions). Absent: `hame`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentName(pub String);

/// The context manifest of the call's next model request in compact form, for the
/// `hame.context.manifest` attribute of that request's `hame.model` span. The harness's
/// `context-manifest` layer puts one in the call's [`Extensions`](crate::Extensions) and
/// [`set`](Self::set)s it before each request; the core takes it when it opens the span,
/// so a request never carries an earlier request's manifest.
#[derive(Debug, Default)]
pub struct ManifestAttribute(std::sync::Mutex<Option<String>>);

impl ManifestAttribute {
    /// The compact manifest of the next request.
    pub fn set(&self, compact: String) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(compact);
    }

    /// Takes what was set (once).
    pub(crate) fn take(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// Records what the provider says about its answer (the model that answered, the
/// response id) on the current `hame.model` span; elsewhere it does nothing.
pub fn record_response(model: Option<&str>, id: Option<&str>) {
    let span = tracing::Span::current();
    if let Some(m) = model.filter(|m| !m.is_empty()) {
        span.record("gen_ai.response.model", m);
    }
    if let Some(i) = id.filter(|i| !i.is_empty()) {
        span.record("gen_ai.response.id", i);
    }
}

/// Marks `span` failed: ERROR status, `description` (without the process's secrets and
/// endpoints) as the status text, `code` as `error.type`.
pub(crate) fn fail(span: &tracing::Span, code: &str, description: &str) {
    span.record("error.type", code);
    span.record("otel.status_code", "error");
    // The bridge makes the description the error status's message (a non-empty one).
    let text = crate::secrets::redact_for_callers(description);
    let text = if text.is_empty() { code } else { &text };
    span.record("otel.status_description", clip(text, MAX_DESCRIPTION));
}

/// The longest error text put on a span (bytes, cut at a character boundary): a tool's
/// error can carry a whole command output.
pub const MAX_DESCRIPTION: usize = 1024;

fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn descriptions_are_cut_at_a_character_boundary() {
        assert_eq!(super::clip("short", 1024), "short");
        let long = "é".repeat(600);
        let cut = super::clip(&long, super::MAX_DESCRIPTION);
        assert_eq!(cut.len(), 1024);
        assert!(long.starts_with(cut));
        assert_eq!(super::clip("aé", 2), "a");
    }
}
