//! The default script of `hame-scripted-server` started without a script file: it answers
//! every request, forever, so the offline tour of the README can make as many calls as it
//! likes.
//!
//! - a request whose last message is a tool result gets the text `The tool returned: …`
//!   (its first 200 characters);
//! - a user message that mentions "write" gets a `write_file` call of `notes.txt` (so a
//!   permission mode can be seen refusing or asking for it);
//! - a user message that mentions "file" gets a `list_files` tool call (so a tool call
//!   and its result can be seen without an API key);
//! - a request without tools (a compaction's summary) gets a short summary text;
//! - any other message gets `Hello from the scripted model. You said: "…"` and a hint.

use serde_json::{Value, json};

use crate::{RecordedRequest, ScriptStep};

/// The reply of the default script to `request` (OpenAI or Anthropic wire format).
pub fn demo_reply(request: &RecordedRequest) -> ScriptStep {
    let messages = request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(last) = messages.last() else {
        return ScriptStep::text("Hello from the scripted model.");
    };
    if let Some(result) = tool_result(last) {
        let head: String = result.chars().take(200).collect();
        return ScriptStep::text(format!("The tool returned: {head}"));
    }
    let text = text_of(&last["content"]);
    // A request without tools (a compaction's summary, a memory flush) gets text.
    let has_tools = request.body["tools"]
        .as_array()
        .is_some_and(|t| !t.is_empty());
    if !has_tools {
        return ScriptStep::text("Summary (scripted): the user and the assistant talked.");
    }
    if text.to_ascii_lowercase().contains("write") {
        let n = messages.len();
        return ScriptStep::tool_call(
            format!("call_demo_{n}"),
            "write_file",
            json!({"file_path": "notes.txt", "content": "written by the demo model\n"}),
        );
    }
    if text.to_ascii_lowercase().contains("file") {
        let n = messages.len();
        return ScriptStep::tool_call(format!("call_demo_{n}"), "list_files", json!({}));
    }
    let said: String = text.chars().take(200).collect();
    ScriptStep::text(format!(
        "Hello from the scripted model. You said: \"{said}\". (Offline demo: mention \"files\" or \"write\" to see a tool call.)"
    ))
}

/// The content of a tool result message: OpenAI `role: tool`, or Anthropic `tool_result`
/// blocks in a user message.
fn tool_result(message: &Value) -> Option<String> {
    if message["role"] == "tool" {
        return Some(text_of(&message["content"]));
    }
    let blocks = message["content"].as_array()?;
    let results: Vec<String> = blocks
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .map(|b| text_of(&b["content"]))
        .collect();
    (!results.is_empty()).then(|| results.join("\n"))
}

/// The text of a content value: a string, or the `text` of its blocks.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str().or_else(|| b.as_str()))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reply;

    fn req(body: Value) -> RecordedRequest {
        RecordedRequest {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: Default::default(),
            body,
        }
    }

    fn text(step: &ScriptStep) -> String {
        match &step.reply {
            Reply::Message { text, .. } => text.clone().unwrap_or_default(),
            _ => String::new(),
        }
    }

    #[test]
    fn greets_calls_a_tool_and_reports_its_result() {
        let tools = json!([{"type": "function", "function": {"name": "list_files"}}]);
        let hi = demo_reply(&req(
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools.clone()}),
        ));
        assert!(text(&hi).contains("You said: \"hi\""), "{hi:?}");
        let files = demo_reply(&req(
            json!({"messages": [{"role": "user", "content": "list the files"}], "tools": tools.clone()}),
        ));
        assert!(
            matches!(&files.reply, Reply::Message { tool_calls, .. } if tool_calls.len() == 1 && tool_calls[0].name == "list_files"),
            "{files:?}"
        );
        let result = demo_reply(&req(json!({"messages": [
            {"role": "user", "content": "list the files"},
            {"role": "tool", "content": "AGENTS.md"}
        ], "tools": tools})));
        assert_eq!(text(&result), "The tool returned: AGENTS.md");
        let summary = demo_reply(&req(
            json!({"messages": [{"role": "user", "content": "files"}]}),
        ));
        assert!(text(&summary).starts_with("Summary"), "{summary:?}");
    }
}

#[cfg(test)]
mod script_file_tests {
    use crate::{Reply, Script};

    #[test]
    fn tool_call_arguments_may_be_an_object_or_its_text() -> Result<(), serde_json::Error> {
        let script = Script::from_json(
            r#"[{"kind": "message", "tool_calls": [
                {"id": "a", "name": "t", "arguments": {"path": "."}},
                {"id": "b", "name": "t", "arguments": "{\"path\":\".\"}"}
            ]}]"#,
        )?;
        let Reply::Message { tool_calls, .. } = &script.steps[0].reply else {
            panic!("not a message: {script:?}");
        };
        assert_eq!(tool_calls[0].arguments, r#"{"path":"."}"#);
        assert_eq!(tool_calls[1].arguments, r#"{"path":"."}"#);
        Ok(())
    }
}
