//! Conversation messages and their persisted form.
//!
//! The serde form of [`Message`] is written to session logs and state stores, so it is a
//! stable format: fields are only ever added (with defaults), never renamed. Messages are
//! versioned by the documents that carry them, which check their version when read: the
//! state ([`STATE_SCHEMA_VERSION`](crate::STATE_SCHEMA_VERSION): a newer one is refused,
//! never rewritten) and the session-log records (`hame_session::RECORD_FORMAT_VERSION`).

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the harness (the system prompt).
    System,
    /// The human or calling program.
    User,
    /// The model.
    Assistant,
    /// Results of tool calls, fed back to the model.
    Tool,
}

/// A request by the model to run one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id that links the call to its result.
    pub id: String,
    /// Name of the tool to run.
    pub name: String,
    /// The arguments exactly as the model produced them: JSON text, possibly malformed.
    ///
    /// Kept as text so that a malformed call can be reported back verbatim.
    pub arguments: String,
}

impl ToolCall {
    /// Parses [`ToolCall::arguments`] as JSON. An empty string counts as `{}`.
    pub fn parse_arguments(&self) -> Result<serde_json::Value, serde_json::Error> {
        if self.arguments.trim().is_empty() {
            return Ok(serde_json::Value::Object(serde_json::Map::new()));
        }
        serde_json::from_str(&self.arguments)
    }
}

/// The outcome of a tool call, as shown to the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the [`ToolCall`] this answers.
    pub id: String,
    /// Text given to the model.
    pub content: String,
    /// Whether the call failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Stable machine-readable error code (`file_not_found`, `invalid_arguments`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// One block of message content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call made by the assistant.
    ToolCall(ToolCall),
    /// A tool result sent back to the model.
    ToolResult(ToolResult),
    /// Model reasoning ("thinking") that some providers return.
    Reasoning {
        /// The reasoning text.
        text: String,
        /// Provider signature needed to send the block back (Anthropic), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// An image the user sent, inline (see [`ImageBlock`]).
    Image(ImageBlock),
}

/// An image inside a message: its media type and its bytes in standard base64.
///
/// hame holds images inline only: it never fetches a URL and never forwards one
/// (docs/adr/0040-inline-images-only.md). Whoever builds the block checks the media type
/// and the base64 (the gateway does); providers send it as it is. Text that stands for the
/// image where bytes cannot go (summaries, daily notes, the context manifest) comes from
/// [`ImageBlock::describe`], never the data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageBlock {
    /// The media type: `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub media_type: String,
    /// The image's bytes, standard base64 with padding.
    pub data: String,
}

impl ImageBlock {
    /// The media types hame accepts (those every image-capable provider takes).
    pub const MEDIA_TYPES: [&'static str; 4] =
        ["image/png", "image/jpeg", "image/gif", "image/webp"];

    /// Most bytes one image may decode to (5 MiB, Anthropic's limit per image); the
    /// gateway and `hame run --image` refuse larger ones.
    pub const MAX_BYTES: usize = 5 * 1024 * 1024;

    /// Most images one request may carry (20): the gateway's OpenAI routes (history
    /// included) and `hame run --image` refuse more.
    pub const MAX_PER_REQUEST: usize = 20;

    /// The media type of [`ImageBlock::MEDIA_TYPES`] whose file signature `bytes` start
    /// with (PNG, JPEG, GIF 87a/89a, WebP), if any.
    pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some("image/png")
        } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
            Some("image/jpeg")
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some("image/gif")
        } else if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP".as_slice()) {
            Some("image/webp")
        } else {
            None
        }
    }

    /// The number of bytes the base64 data decodes to (computed from its length).
    pub fn decoded_len(&self) -> usize {
        let d = self.data.trim_end();
        let pad = d.bytes().rev().take_while(|b| *b == b'=').count().min(2);
        (d.len() / 4 * 3 + (d.len() % 4).saturating_sub(1)).saturating_sub(pad)
    }

    /// A short text that stands for the image: `[image image/png, 12 KiB]`.
    pub fn describe(&self) -> String {
        format!(
            "[image {}, {} KiB]",
            self.media_type,
            self.decoded_len().div_ceil(1024)
        )
    }
}

/// Token counts reported for one model request or summed over a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache, when reported (Anthropic
    /// `cache_read_input_tokens`, OpenAI `prompt_tokens_details.cached_tokens`); part of
    /// `input_tokens`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// Prompt tokens written to the provider's cache by this request, when reported
    /// (Anthropic `cache_creation_input_tokens`, billed above the input price); part of
    /// `input_tokens`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_input_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Total tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Adds another usage to this one.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.cache_write_input_tokens += other.cache_write_input_tokens;
    }
}

/// The content blocks of a [`Message`], shared on clone: copying a conversation (into each
/// model request) copies pointers, not texts. Reads go through `Deref` to the `Vec`; the
/// first write to a shared copy clones it (`Arc::make_mut`). Serialised as a plain list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Blocks(std::sync::Arc<Vec<ContentBlock>>);

impl Blocks {
    /// A weak handle on the shared blocks: messages cloned from one message share them
    /// until one is changed, so while the handle upgrades, a message whose blocks are the
    /// handle's ([`std::sync::Weak::ptr_eq`]) has the same content. Lets a cache recognise
    /// a message it measured without serialising it; holding the handle keeps the blocks'
    /// address from being reused.
    pub fn share_handle(&self) -> std::sync::Weak<Vec<ContentBlock>> {
        std::sync::Arc::downgrade(&self.0)
    }
}

impl std::ops::Deref for Blocks {
    type Target = Vec<ContentBlock>;
    fn deref(&self) -> &Vec<ContentBlock> {
        &self.0
    }
}

impl std::ops::DerefMut for Blocks {
    fn deref_mut(&mut self) -> &mut Vec<ContentBlock> {
        std::sync::Arc::make_mut(&mut self.0)
    }
}

impl From<Vec<ContentBlock>> for Blocks {
    fn from(v: Vec<ContentBlock>) -> Self {
        Self(std::sync::Arc::new(v))
    }
}

impl FromIterator<ContentBlock> for Blocks {
    fn from_iter<I: IntoIterator<Item = ContentBlock>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Blocks {
    type Item = &'a ContentBlock;
    type IntoIter = std::slice::Iter<'a, ContentBlock>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a mut Blocks {
    type Item = &'a mut ContentBlock;
    type IntoIter = std::slice::IterMut<'a, ContentBlock>;
    fn into_iter(self) -> Self::IntoIter {
        std::sync::Arc::make_mut(&mut self.0).iter_mut()
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Content blocks in order.
    pub content: Blocks,
    /// Usage of the model request that produced this message (assistant messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl Message {
    /// A message with the given role and one text block.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: vec![ContentBlock::Text { text: text.into() }].into(),
            usage: None,
        }
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::text(Role::User, text)
    }

    /// A user message of text and images: the text first (when not empty), then the
    /// images in order.
    pub fn user_with_images(text: impl Into<String>, images: Vec<ImageBlock>) -> Self {
        let text = text.into();
        let text = (!text.is_empty()).then_some(ContentBlock::Text { text });
        Self {
            role: Role::User,
            content: text
                .into_iter()
                .chain(images.into_iter().map(ContentBlock::Image))
                .collect(),
            usage: None,
        }
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::text(Role::Assistant, text)
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::text(Role::System, text)
    }

    /// A tool message carrying results.
    pub fn tool_results(results: Vec<ToolResult>) -> Self {
        Self {
            role: Role::Tool,
            content: results.into_iter().map(ContentBlock::ToolResult).collect(),
            usage: None,
        }
    }

    /// The images in this message.
    pub fn images(&self) -> impl Iterator<Item = &ImageBlock> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::Image(i) => Some(i),
            _ => None,
        })
    }

    /// All text blocks joined with no separator.
    pub fn text_content(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The tool calls in this message.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolCall(c) => Some(c),
            _ => None,
        })
    }

    /// The tool results in this message.
    pub fn tool_results_iter(&self) -> impl Iterator<Item = &ToolResult> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolResult(r) => Some(r),
            _ => None,
        })
    }

    /// Whether this message asks for at least one tool call.
    pub fn has_tool_calls(&self) -> bool {
        self.tool_calls().next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn sample() -> Vec<Message> {
        vec![
            Message::system("be brief"),
            Message::user("hi"),
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentBlock::Reasoning {
                        text: "think".into(),
                        signature: Some("sig".into()),
                    },
                    ContentBlock::Text {
                        text: "calling".into(),
                    },
                    ContentBlock::ToolCall(ToolCall {
                        id: "c1".into(),
                        name: "read_file".into(),
                        arguments: r#"{"path":"a.txt"}"#.into(),
                    }),
                ]
                .into(),
                usage: Some(Usage {
                    input_tokens: 10,
                    output_tokens: 3,
                    cached_input_tokens: 0,
                    cache_write_input_tokens: 0,
                }),
            },
            Message::tool_results(vec![ToolResult {
                id: "c1".into(),
                content: "no such file".into(),
                is_error: true,
                code: Some("file_not_found".into()),
            }]),
        ]
    }

    #[test]
    fn serde_round_trip() -> Result<(), serde_json::Error> {
        let msgs = sample();
        let text = serde_json::to_string(&msgs)?;
        let back: Vec<Message> = serde_json::from_str(&text)?;
        assert_eq!(msgs, back);
        Ok(())
    }

    /// The persisted form is a contract: this literal must keep parsing forever.
    #[test]
    fn format_v1_is_stable() -> Result<(), serde_json::Error> {
        let v1 = r#"[
          {"role":"user","content":[{"type":"text","text":"hi"}]},
          {"role":"assistant","content":[{"type":"tool_call","id":"c1","name":"ls","arguments":"{}"}],
           "usage":{"input_tokens":5,"output_tokens":2}},
          {"role":"tool","content":[{"type":"tool_result","id":"c1","content":"ok"}]}
        ]"#;
        let msgs: Vec<Message> = serde_json::from_str(v1)?;
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[1].tool_calls().count(), 1);
        assert_eq!(
            msgs[2].tool_results_iter().next(),
            Some(&ToolResult {
                id: "c1".into(),
                content: "ok".into(),
                is_error: false,
                code: None
            })
        );
        let again = serde_json::to_value(&msgs)?;
        let orig: serde_json::Value = serde_json::from_str(v1)?;
        assert_eq!(orig, again);
        Ok(())
    }

    /// An image block's persisted form: `{"type":"image","media_type":..,"data":..}`.
    #[test]
    fn an_image_block_has_a_stable_form_and_a_short_description() -> Result<(), serde_json::Error> {
        let form = r#"{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image","media_type":"image/png","data":"iVBORw0KGgo="}]}"#;
        let m: Message = serde_json::from_str(form)?;
        let image = ImageBlock {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        };
        assert_eq!(m.images().collect::<Vec<_>>(), vec![&image]);
        assert_eq!(m.text_content(), "what is this?");
        assert_eq!(serde_json::to_string(&m)?, form);
        assert_eq!(image.decoded_len(), 8);
        assert_eq!(image.describe(), "[image image/png, 1 KiB]");
        let sizes: Vec<usize> = ["", "QQ==", "QUI=", "QUJD", "QUJDRA", "QUJDREU"]
            .iter()
            .map(|d| {
                ImageBlock {
                    media_type: "image/gif".into(),
                    data: (*d).into(),
                }
                .decoded_len()
            })
            .collect();
        assert_eq!(sizes, vec![0, 1, 2, 3, 4, 5]);
        let sniffed: Vec<Option<&str>> = [
            b"\x89PNG\r\n\x1a\n..".as_slice(),
            b"\xff\xd8\xff\xe0",
            b"GIF87a",
            b"GIF89a",
            b"RIFF\0\0\0\0WEBPVP8 ",
            b"RIFF\0\0\0\0WAVE",
            b"<svg/>",
            b"",
        ]
        .iter()
        .map(|b| ImageBlock::sniff(b))
        .collect();
        assert_eq!(
            sniffed,
            vec![
                Some("image/png"),
                Some("image/jpeg"),
                Some("image/gif"),
                Some("image/gif"),
                Some("image/webp"),
                None,
                None,
                None
            ]
        );
        Ok(())
    }

    #[test]
    fn empty_arguments_parse_as_object() -> Result<(), serde_json::Error> {
        let c = ToolCall {
            id: "x".into(),
            name: "t".into(),
            arguments: " ".into(),
        };
        assert_eq!(c.parse_arguments()?, serde_json::json!({}));
        Ok(())
    }
}
