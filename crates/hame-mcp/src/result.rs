//! Pure conversion of call results.

/// What a `tools/call` returned, as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallResult {
    /// The text: every text block in order, a note per image, audio or binary resource,
    /// the structured content as JSON when there is no text.
    pub text: String,
    /// The server flagged the result as an error (`isError`).
    pub is_error: bool,
}

/// Renders a `tools/call` result (its JSON form: `content`, `structuredContent`,
/// `isError`) as text for the model.
pub fn render_result(result: &serde_json::Value) -> CallResult {
    let mut parts: Vec<String> = Vec::new();
    let blocks = result
        .get("content")
        .and_then(|c| c.as_array())
        .cloned()
        .unwrap_or_default();
    for block in &blocks {
        let kind = block.get("type").and_then(|t| t.as_str()).unwrap_or("");
        let s = |k: &str| block.get(k).and_then(|v| v.as_str()).unwrap_or("");
        match kind {
            "text" => parts.push(s("text").to_owned()),
            "image" | "audio" => {
                let len = s("data").len() / 4 * 3;
                parts.push(format!(
                    "[{kind} {} of about {len} bytes, not shown]",
                    if s("mimeType").is_empty() {
                        "(unknown type)"
                    } else {
                        s("mimeType")
                    }
                ));
            }
            "resource" => {
                let r = block.get("resource").cloned().unwrap_or_default();
                let uri = r.get("uri").and_then(|v| v.as_str()).unwrap_or("");
                match r.get("text").and_then(|v| v.as_str()) {
                    Some(text) => parts.push(format!("[resource {uri}]\n{text}")),
                    None => parts.push(format!("[binary resource {uri}, not shown]")),
                }
            }
            "resource_link" => parts.push(format!("[resource link {} {}]", s("name"), s("uri"))),
            other => parts.push(format!("[{other} content, not shown]")),
        }
    }
    if let Some(structured) = result.get("structuredContent")
        && !structured.is_null()
        && parts.iter().all(|p| p.trim().is_empty())
    {
        parts = vec![structured.to_string()];
    }
    CallResult {
        text: parts.join("\n"),
        is_error: result
            .get("isError")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn several_blocks_images_and_structured_content() {
        let r = render_result(&json!({
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "data": "AAAA", "mimeType": "image/png"},
                {"type": "text", "text": "two"},
                {"type": "resource", "resource": {"uri": "file:///a", "text": "body"}}
            ],
            "isError": false
        }));
        assert_eq!(
            r,
            CallResult {
                text: "one\n[image image/png of about 3 bytes, not shown]\ntwo\n[resource file:///a]\nbody".into(),
                is_error: false
            }
        );
        let s = render_result(&json!({"content": [], "structuredContent": {"n": 3}}));
        assert_eq!(s.text, r#"{"n":3}"#);
        let e =
            render_result(&json!({"content": [{"type": "text", "text": "bad"}], "isError": true}));
        assert!(e.is_error);
        assert_eq!(e.text, "bad");
    }
}
