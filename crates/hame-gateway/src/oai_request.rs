//! What an OpenAI-compatible request asks for, read without I/O: every field is honoured
//! (it becomes part of a [`Parsed`]) or refused with a [`Refusal`] naming it — never
//! dropped. Shared by `POST /v1/chat/completions` ([`parse_chat`]) and `POST /v1/responses`
//! (`crate::responses`).

use hame::harness::caller::{ReplyFormat, check_schema};
use hame::{ContentBlock, ImageBlock, Message, Role, ToolCall, ToolResult, ToolSpec};
use serde_json::{Map, Value};

/// A request refused with 400: the field (`param`) and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub(crate) code: &'static str,
    pub(crate) param: String,
    pub(crate) message: String,
}

impl Refusal {
    pub(crate) fn unsupported(param: impl Into<String>, why: impl Into<String>) -> Self {
        let param = param.into();
        Self {
            code: "unsupported_parameter",
            message: format!("`{param}` is not supported by this server: {}", why.into()),
            param,
        }
    }

    pub(crate) fn invalid(param: impl Into<String>, why: impl Into<String>) -> Self {
        let param = param.into();
        Self {
            code: "invalid_value",
            message: format!("`{param}`: {}", why.into()),
            param,
        }
    }

    pub(crate) fn missing(param: &str) -> Self {
        Self {
            code: "missing_required_parameter",
            message: format!("`{param}` is required"),
            param: param.to_owned(),
        }
    }
}

type R<T> = Result<T, Refusal>;

/// How the request's conversation ends: what this turn adds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tail {
    /// A new user message: text and images.
    User(Message),
    /// Results of client tool calls: `(tool_call_id, output)` in order.
    ToolResults(Vec<(String, String)>),
}

/// A client tool as the request declares it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClientTool {
    pub(crate) spec: ToolSpec,
    /// `strict: true`: the model's arguments are checked against the schema.
    pub(crate) strict: bool,
}

/// What the request asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parsed {
    pub(crate) model: String,
    pub(crate) stream: bool,
    /// `stream_options.include_usage`.
    pub(crate) include_usage: bool,
    /// The `system` / `developer` messages (or `instructions`), joined.
    pub(crate) instructions: Option<String>,
    /// The conversation before the [`Tail`], without system messages.
    pub(crate) history: Vec<Message>,
    pub(crate) tail: Tail,
    pub(crate) tools: Vec<ClientTool>,
    /// `tool_choice: "none"`: no tool is offered to the model (hame's neither).
    pub(crate) no_tools: bool,
    pub(crate) temperature: Option<f32>,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) reply_format: Option<ReplyFormat>,
    /// `previous_response_id` (Responses).
    pub(crate) previous_response: Option<String>,
}

impl Parsed {
    /// A request that has asked for nothing yet: every field at its default, but
    /// `include_usage` (the API's default for it).
    pub(crate) fn new(include_usage: bool) -> Self {
        Self {
            model: String::new(),
            stream: false,
            include_usage,
            instructions: None,
            history: Vec::new(),
            tail: Tail::User(Message::user(String::new())),
            tools: Vec::new(),
            no_tools: false,
            temperature: None,
            max_tokens: None,
            reply_format: None,
            previous_response: None,
        }
    }
}

/// The fields of an object, with `null` values removed (a `null` is the field's default,
/// as the OpenAI API reads it).
pub(crate) fn fields(v: &Value) -> Map<String, Value> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A field whose only accepted value is its default (`ok`); any other value is refused.
fn only_default(param: &str, v: &Value, ok: impl Fn(&Value) -> bool, why: &str) -> R<()> {
    if ok(v) {
        Ok(())
    } else {
        Err(Refusal::unsupported(param, why))
    }
}

fn as_bool(param: &str, v: &Value) -> R<bool> {
    v.as_bool()
        .ok_or_else(|| Refusal::invalid(param, format!("must be a boolean, not {v}")))
}

/// `model`: a string.
pub(crate) fn model(v: &Value) -> R<String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| Refusal::invalid("model", "must be a string"))
}

/// `temperature`: a number from 0 to 2.
pub(crate) fn temperature(v: &Value) -> R<f32> {
    match v.as_f64() {
        #[allow(clippy::cast_possible_truncation)]
        Some(t) if (0.0..=2.0).contains(&t) => Ok(t as f32),
        _ => Err(Refusal::invalid(
            "temperature",
            "must be a number from 0 to 2",
        )),
    }
}

/// A limit of tokens (`param`): a positive integer.
pub(crate) fn token_limit(param: &str, v: &Value) -> R<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| Refusal::invalid(param, "must be a positive integer"))
}

/// Most bytes one image may decode to ([`ImageBlock::MAX_BYTES`], 5 MiB).
pub(crate) const MAX_IMAGE_BYTES: usize = ImageBlock::MAX_BYTES;

/// Most images one request may carry, history included ([`ImageBlock::MAX_PER_REQUEST`]).
pub(crate) const MAX_IMAGES: usize = ImageBlock::MAX_PER_REQUEST;

/// What a content list may hold besides text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parts {
    /// Text only (system, developer, assistant and tool content).
    Text,
    /// Text and images (user content).
    TextAndImages,
}

/// A text content: a string, or a list of text parts (`text`, `input_text`,
/// `output_text`); any other part (an image, audio, a file) is refused with its place.
pub(crate) fn text_of(param: &str, v: &Value) -> R<String> {
    Ok(Message {
        role: Role::User,
        content: content_of(param, v, Parts::Text)?.into(),
        usage: None,
    }
    .text_content())
}

/// A user message's content: a string, or a list of text parts and image parts
/// (`image_url`, `input_image`: inline `data:` URLs only, see [`image_of`]). Adjacent
/// text parts join with a newline into one text block, so a text-only message is the
/// same [`Message::user`] whatever its spelling.
pub(crate) fn user_message(param: &str, v: &Value) -> R<Message> {
    Ok(Message {
        role: Role::User,
        content: content_of(param, v, Parts::TextAndImages)?.into(),
        usage: None,
    })
}

fn content_of(param: &str, v: &Value, allow: Parts) -> R<Vec<ContentBlock>> {
    let mut out: Vec<ContentBlock> = Vec::new();
    let text = |out: &mut Vec<ContentBlock>, t: &str| match out.last_mut() {
        Some(ContentBlock::Text { text }) => {
            text.push('\n');
            text.push_str(t);
        }
        _ => out.push(ContentBlock::Text { text: t.to_owned() }),
    };
    match v {
        Value::String(s) => text(&mut out, s),
        Value::Null => text(&mut out, ""),
        Value::Array(parts) => {
            for (j, p) in parts.iter().enumerate() {
                let here = format!("{param}[{j}]");
                let kind = p["type"].as_str().unwrap_or_default();
                match kind {
                    "text" | "input_text" | "output_text" => {
                        for k in fields(p).keys() {
                            if !matches!(k.as_str(), "type" | "text" | "annotations" | "logprobs") {
                                return Err(Refusal::unsupported(
                                    format!("{here}.{k}"),
                                    "text parts carry only `type` and `text`",
                                ));
                            }
                        }
                        let t = p["text"].as_str().ok_or_else(|| {
                            Refusal::invalid(format!("{here}.text"), "must be a string")
                        })?;
                        text(&mut out, t);
                    }
                    "image_url" | "input_image" if allow == Parts::Text => {
                        return Err(Refusal::unsupported(
                            here,
                            "images are accepted in user messages only",
                        ));
                    }
                    "image_url" => out.push(ContentBlock::Image(chat_image(&here, p)?)),
                    "input_image" => out.push(ContentBlock::Image(input_image(&here, p)?)),
                    other => {
                        let accepted = match allow {
                            Parts::Text => "send text",
                            Parts::TextAndImages => "send text and images",
                        };
                        return Err(Refusal::unsupported(
                            format!("{here}.type"),
                            format!("content parts of type {other:?} are not accepted; {accepted}"),
                        ));
                    }
                }
            }
            if out.is_empty() {
                text(&mut out, "");
            }
        }
        _ => {
            return Err(Refusal::invalid(
                param,
                "must be a string or a list of content parts",
            ));
        }
    }
    Ok(out)
}

/// A chat `image_url` part: `{"type": "image_url", "image_url": URL | {"url", "detail"}}`.
fn chat_image(here: &str, p: &Value) -> R<ImageBlock> {
    only_keys(&fields(p), here, "image_url part", &["type", "image_url"])?;
    let at = format!("{here}.image_url");
    match &p["image_url"] {
        Value::String(url) => image_of(&at, url),
        Value::Object(_) => {
            let f = fields(&p["image_url"]);
            only_keys(&f, &at, "image_url", &["url", "detail"])?;
            if let Some(d) = f.get("detail") {
                detail(&format!("{at}.detail"), d)?;
            }
            let url = f
                .get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| Refusal::missing(&format!("{at}.url")))?;
            image_of(&format!("{at}.url"), url)
        }
        Value::Null => Err(Refusal::missing(&at)),
        _ => Err(Refusal::invalid(
            at,
            "must be a data: URL or {\"url\": ...}",
        )),
    }
}

/// A Responses `input_image` part: `{"type": "input_image", "image_url", "detail"}`; a
/// `file_id` is refused (hame keeps no uploaded files for the model).
fn input_image(here: &str, p: &Value) -> R<ImageBlock> {
    let f = fields(p);
    if f.contains_key("file_id") {
        return Err(Refusal::unsupported(
            format!("{here}.file_id"),
            "images by file id are not accepted; send the image inline as a data: URL in `image_url`",
        ));
    }
    only_keys(
        &f,
        here,
        "input_image part",
        &["type", "image_url", "detail"],
    )?;
    if let Some(d) = f.get("detail") {
        detail(&format!("{here}.detail"), d)?;
    }
    let at = format!("{here}.image_url");
    match f.get("image_url") {
        Some(Value::String(url)) => image_of(&at, url),
        Some(_) => Err(Refusal::invalid(at, format!("must be a string; {INLINE}"))),
        None => Err(Refusal::missing(&at)),
    }
}

/// `detail`: only `"auto"` (the providers' default) is accepted; hame's image block
/// carries no detail level, so `"low"` and `"high"` could not be honoured.
fn detail(param: &str, v: &Value) -> R<()> {
    match v.as_str() {
        Some("auto") => Ok(()),
        Some("low" | "high") => Err(Refusal::unsupported(
            param,
            "only \"auto\" is honoured: the image goes to the model at the provider's default detail",
        )),
        _ => Err(Refusal::invalid(
            param,
            "must be \"auto\", \"low\" or \"high\"",
        )),
    }
}

/// The advice every refused image URL ends with.
const INLINE: &str = "send the image inline as a data: URL (data:image/png;base64,...)";

/// An image from a URL, which must be `data:<media type>;base64,<data>` with a media type
/// of [`ImageBlock::MEDIA_TYPES`], standard base64 data of at most [`MAX_IMAGE_BYTES`]
/// decoded, and bytes that start like that type's files. hame never fetches a URL nor
/// forwards one (docs/adr/0040-inline-images-only.md): any other scheme is refused.
pub(crate) fn image_of(param: &str, url: &str) -> R<ImageBlock> {
    let scheme_end = url.find(':').unwrap_or(0);
    let scheme = url[..scheme_end].to_ascii_lowercase();
    if scheme != "data" {
        let shown = if scheme.is_empty() || scheme.len() > 16 {
            "a URL without a scheme".to_owned()
        } else {
            format!("{scheme}: URLs")
        };
        return Err(Refusal::unsupported(
            param,
            format!(
                "hame does not fetch images ({shown} are refused: a model server could be made to fetch internal addresses); {INLINE}"
            ),
        ));
    }
    let rest = &url[scheme_end + 1..];
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(Refusal::invalid(
            param,
            format!("a data: URL needs a comma before its data; {INLINE}"),
        ));
    };
    let media_type = meta
        .strip_suffix(";base64")
        .or_else(|| meta.strip_suffix(";BASE64"))
        .map(str::to_ascii_lowercase)
        .filter(|m| ImageBlock::MEDIA_TYPES.contains(&m.as_str()))
        .ok_or_else(|| {
            let meta: String = meta.chars().take(40).collect();
            let meta = meta
                .strip_suffix(";base64")
                .or_else(|| meta.strip_suffix(";BASE64"))
                .unwrap_or(&meta);
            Refusal::unsupported(
                param,
                format!(
                    "the data: URL's type {meta:?} is not accepted: image/png, image/jpeg, image/gif or image/webp, base64-encoded, are; {INLINE}"
                ),
            )
        })?;
    // Refuse an oversized image before decoding it.
    if data.len() > MAX_IMAGE_BYTES.div_ceil(3) * 4 {
        return Err(too_large(param));
    }
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| {
            Refusal::invalid(
                param,
                format!("the image data is not standard base64 ({e}); {INLINE}"),
            )
        })?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_large(param));
    }
    if ImageBlock::sniff(&bytes) != Some(media_type.as_str()) {
        return Err(Refusal::invalid(
            param,
            format!(
                "the data is not {media_type} (its first bytes are not that format's signature)"
            ),
        ));
    }
    Ok(ImageBlock {
        media_type,
        data: data.to_owned(),
    })
}

fn too_large(param: &str) -> Refusal {
    Refusal::invalid(
        param,
        format!(
            "the image is larger than {} MiB decoded; send a smaller image",
            MAX_IMAGE_BYTES / (1024 * 1024)
        ),
    )
}

/// The reply format whose `{param}.type` is `kind`: none for `text`; a `json_schema` one is
/// read by `schema` (with [`json_schema_format`]).
pub(crate) fn reply_format(
    param: &str,
    kind: Option<&str>,
    schema: impl FnOnce() -> R<ReplyFormat>,
) -> R<Option<ReplyFormat>> {
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ReplyFormat::JsonObject)),
        Some("json_schema") => schema().map(Some),
        _ => Err(Refusal::invalid(
            format!("{param}.type"),
            "must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// A reply format from the fields `f` of a JSON Schema format at `param` (the keys it
/// may carry: `allowed`): its `name` and its `schema`, which must be in the checked
/// subset.
pub(crate) fn json_schema_format(
    param: &str,
    f: &Map<String, Value>,
    allowed: &[&str],
) -> R<ReplyFormat> {
    let name = name_of(f, param, allowed, "unknown field")?;
    let schema = f
        .get("schema")
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    check_schema(&schema).map_err(|e| {
        Refusal::unsupported(
            format!("{param}.schema"),
            format!("{e} (docs/openai-compat.md lists the checked keywords)"),
        )
    })?;
    Ok(ReplyFormat::JsonSchema {
        name: name.to_owned(),
        schema,
    })
}

/// Client tools of `tools` (`nested`: chat's `{"type": "function", "function": {...}}`;
/// else the Responses shape `{"type": "function", "name", ...}`); a name hame's agent
/// already has (`taken`) or a repeated one is refused.
pub(crate) fn client_tools(v: &Value, nested: bool, taken: &[String]) -> R<Vec<ClientTool>> {
    let Some(list) = v.as_array() else {
        return Err(Refusal::invalid("tools", "must be a list"));
    };
    let mut out: Vec<ClientTool> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let here = format!("tools[{i}]");
        let kind = t["type"].as_str().unwrap_or_default();
        if kind != "function" {
            return Err(Refusal::unsupported(
                format!("{here}.type"),
                format!("only function tools are accepted, not {kind:?}"),
            ));
        }
        let (f, at) = if nested {
            if let Some(k) = unknown_key(&fields(t), &["type", "function"]) {
                return Err(Refusal::unsupported(
                    format!("{here}.{k}"),
                    "unknown tool field",
                ));
            }
            (fields(&t["function"]), format!("{here}.function"))
        } else {
            (fields(t), here.clone())
        };
        let name = name_of(
            &f,
            &at,
            &["name", "description", "parameters", "strict", "type"],
            "unknown tool field",
        )?;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(Refusal::invalid(
                format!("{at}.name"),
                "must match [a-zA-Z0-9_-]{1,64}",
            ));
        }
        if taken.iter().any(|t| t == name) {
            return Err(Refusal::invalid(
                format!("{at}.name"),
                format!("`{name}` is a tool of the agent itself; rename the client tool"),
            ));
        }
        if out.iter().any(|t| t.spec.name == name) {
            return Err(Refusal::invalid(
                format!("{at}.name"),
                format!("`{name}` is declared twice"),
            ));
        }
        let strict = match f.get("strict") {
            Some(v) => as_bool(&format!("{at}.strict"), v)?,
            None => false,
        };
        let parameters = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            return Err(Refusal::invalid(
                format!("{at}.parameters"),
                "must be a JSON Schema object",
            ));
        }
        if strict {
            check_schema(&parameters).map_err(|e| {
                Refusal::unsupported(
                    format!("{at}.parameters"),
                    format!("{e}; with `strict: true` the arguments are checked, so the schema must use the checked keywords"),
                )
            })?;
        }
        out.push(ClientTool {
            spec: ToolSpec {
                name: name.to_owned(),
                description: f
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                parameters: std::sync::Arc::new(parameters),
            },
            strict,
        });
    }
    Ok(out)
}

/// `tool_choice`: `"auto"` (the default) or `"none"` (no tool offered); forcing a tool is
/// refused.
pub(crate) fn tool_choice(v: &Value) -> R<bool> {
    match v.as_str() {
        Some("auto") => Ok(false),
        Some("none") => Ok(true),
        _ => Err(Refusal::unsupported(
            "tool_choice",
            "only \"auto\" and \"none\" are honoured (hame's model requests cannot force a tool)",
        )),
    }
}

/// Reads a `POST /v1/chat/completions` body; `taken` are the agent's own tool names.
pub(crate) fn parse_chat(body: &Value, taken: &[String]) -> R<Parsed> {
    if !body.is_object() {
        return Err(Refusal::invalid("body", "must be a JSON object"));
    }
    let f = fields(body);
    let mut p = Parsed::new(false);
    let mut messages = None;
    let mut stream_options = None;
    for (k, v) in &f {
        match k.as_str() {
            "model" => p.model = model(v)?,
            "messages" => messages = Some(v),
            "stream" => p.stream = as_bool("stream", v)?,
            "stream_options" => stream_options = Some(v),
            "tools" => p.tools = client_tools(v, true, taken)?,
            "tool_choice" => p.no_tools = tool_choice(v)?,
            "parallel_tool_calls" => only_default(
                k,
                v,
                |v| v == &Value::Bool(true),
                "the model may always make several calls at once",
            )?,
            "response_format" => p.reply_format = chat_format(v)?,
            "temperature" => p.temperature = Some(temperature(v)?),
            "max_tokens" | "max_completion_tokens" => p.max_tokens = Some(token_limit(k, v)?),
            "n" => only_default(k, v, |v| v.as_u64() == Some(1), "one choice per request")?,
            "top_p" => only_default(
                k,
                v,
                |v| v.as_f64() == Some(1.0),
                "the model's sampling is not changed per request",
            )?,
            "frequency_penalty" | "presence_penalty" => only_default(
                k,
                v,
                |v| v.as_f64() == Some(0.0),
                "the model's sampling is not changed per request",
            )?,
            "logprobs" => only_default(
                k,
                v,
                |v| v == &Value::Bool(false),
                "log probabilities are not returned",
            )?,
            "store" => only_default(
                k,
                v,
                |v| v == &Value::Bool(false),
                "the session log is the record; nothing is stored for distillation",
            )?,
            "user" => {
                return Err(Refusal::unsupported(
                    k,
                    "the caller is the bearer token's user (or `X-Hame-User`)",
                ));
            }
            _ => {
                return Err(Refusal::unsupported(
                    k.as_str(),
                    "it is not among the fields docs/openai-compat.md lists",
                ));
            }
        }
    }
    if p.model.is_empty() {
        return Err(Refusal::missing("model"));
    }
    if let Some(o) = stream_options {
        if !p.stream {
            return Err(Refusal::invalid(
                "stream_options",
                "only allowed when `stream` is true",
            ));
        }
        for (k, v) in fields(o) {
            match k.as_str() {
                "include_usage" => p.include_usage = as_bool("stream_options.include_usage", &v)?,
                _ => {
                    return Err(Refusal::unsupported(
                        format!("stream_options.{k}"),
                        "only `include_usage` is honoured",
                    ));
                }
            }
        }
    }
    let messages = messages
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| Refusal::missing("messages"))?;
    let (instructions, history, tail) = chat_messages(messages)?;
    p.instructions = instructions;
    p.history = history;
    p.tail = tail;
    Ok(p)
}

fn chat_format(v: &Value) -> R<Option<ReplyFormat>> {
    reply_format("response_format", v["type"].as_str(), || {
        json_schema_format(
            "response_format.json_schema",
            &fields(&v["json_schema"]),
            &["name", "schema", "strict", "description"],
        )
    })
}

/// The conversation of a chat request: instructions, history and tail.
fn chat_messages(messages: &[Value]) -> R<(Option<String>, Vec<Message>, Tail)> {
    let mut instructions: Vec<String> = Vec::new();
    let mut convo: Vec<Message> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let here = format!("messages[{i}]");
        let f = fields(m);
        let role = f
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::missing(&format!("{here}.role")))?;
        let allowed: &[&str] = match role {
            "system" | "developer" | "user" => &["role", "content"],
            "assistant" => &["role", "content", "tool_calls", "refusal"],
            "tool" => &["role", "content", "tool_call_id"],
            other => {
                return Err(Refusal::unsupported(
                    format!("{here}.role"),
                    format!(
                        "the role {other:?} is not accepted (system, developer, user, assistant, tool are)"
                    ),
                ));
            }
        };
        only_keys(&f, &here, &format!("{role} message"), allowed)?;
        let content = f.get("content").cloned().unwrap_or(Value::Null);
        match role {
            "system" | "developer" => {
                let t = text_of(&format!("{here}.content"), &content)?;
                if !t.trim().is_empty() {
                    instructions.push(t);
                }
            }
            "user" => convo.push(user_message(&format!("{here}.content"), &content)?),
            "assistant" => {
                let mut blocks = Vec::new();
                let text = text_of(&format!("{here}.content"), &content)?;
                if !text.is_empty() {
                    blocks.push(ContentBlock::Text { text });
                }
                if let Some(calls) = f.get("tool_calls") {
                    let list = calls.as_array().ok_or_else(|| {
                        Refusal::invalid(format!("{here}.tool_calls"), "must be a list")
                    })?;
                    for (j, c) in list.iter().enumerate() {
                        let at = format!("{here}.tool_calls[{j}]");
                        let id = c["id"]
                            .as_str()
                            .ok_or_else(|| Refusal::missing(&format!("{at}.id")))?;
                        let name = c["function"]["name"]
                            .as_str()
                            .ok_or_else(|| Refusal::missing(&format!("{at}.function.name")))?;
                        let arguments = c["function"]["arguments"].as_str().unwrap_or("{}");
                        blocks.push(ContentBlock::ToolCall(ToolCall {
                            id: id.to_owned(),
                            name: name.to_owned(),
                            arguments: arguments.to_owned(),
                        }));
                    }
                }
                convo.push(Message {
                    role: Role::Assistant,
                    content: blocks.into(),
                    usage: None,
                });
            }
            _ => {
                let id = f
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Refusal::missing(&format!("{here}.tool_call_id")))?;
                let text = text_of(&format!("{here}.content"), &content)?;
                push_result(&mut convo, id, text);
            }
        }
    }
    let (history, tail) = split_tail(convo)?;
    let instructions = (!instructions.is_empty()).then(|| instructions.join("\n\n"));
    Ok((instructions, history, tail))
}

/// Adds a tool result, joining it to a directly preceding tool-results message.
pub(crate) fn push_result(convo: &mut Vec<Message>, id: &str, text: String) {
    let result = ToolResult {
        id: id.to_owned(),
        content: text,
        is_error: false,
        code: None,
    };
    if let Some(last) = convo.last_mut()
        && last.role == Role::Tool
    {
        last.content.push(ContentBlock::ToolResult(result));
        return;
    }
    convo.push(Message::tool_results(vec![result]));
}

/// The conversation split into what came before and what this turn adds (the last user
/// message, or the trailing tool results).
pub(crate) fn split_tail(mut convo: Vec<Message>) -> R<(Vec<Message>, Tail)> {
    let images = convo.iter().map(|m| m.images().count()).sum::<usize>();
    if images > MAX_IMAGES {
        return Err(Refusal::invalid(
            "messages",
            format!(
                "carries {images} images; at most {MAX_IMAGES} per request are accepted (earlier messages included)"
            ),
        ));
    }
    let Some(last) = convo.pop() else {
        return Err(Refusal::invalid(
            "messages",
            "needs a user message or tool results",
        ));
    };
    match last.role {
        Role::User => {
            if last.text_content().trim().is_empty() && last.images().next().is_none() {
                return Err(Refusal::invalid(
                    "messages",
                    "the last user message has no text and no image",
                ));
            }
            Ok((convo, Tail::User(last)))
        }
        Role::Tool => {
            let results = last
                .tool_results_iter()
                .map(|r| (r.id.clone(), r.content.clone()))
                .collect();
            Ok((convo, Tail::ToolResults(results)))
        }
        _ => Err(Refusal::invalid(
            "messages",
            "the last message must be a user message or tool results",
        )),
    }
}

/// `text` as lowercase hex digits (a session id inside another id).
pub(crate) fn hex_encode(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The text of [`hex_encode`]d digits.
pub(crate) fn hex_decode(hex: &str) -> Option<String> {
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Refuses any key of `f` not in `allowed`, naming it under `here`.
pub(crate) fn only_keys(f: &Map<String, Value>, here: &str, what: &str, allowed: &[&str]) -> R<()> {
    match unknown_key(f, allowed) {
        Some(k) => Err(Refusal::unsupported(
            format!("{here}.{k}"),
            format!("a {what} carries only {}", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The `name` of the object of fields `f` at `at`, which may carry only the keys `allowed`
/// (another is refused: `why`).
fn name_of<'a>(f: &'a Map<String, Value>, at: &str, allowed: &[&str], why: &str) -> R<&'a str> {
    if let Some(k) = unknown_key(f, allowed) {
        return Err(Refusal::unsupported(format!("{at}.{k}"), why));
    }
    f.get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::missing(&format!("{at}.name")))
}

/// The first key of `f` (in its order) that is not in `allowed`.
fn unknown_key<'a>(f: &'a Map<String, Value>, allowed: &[&str]) -> Option<&'a String> {
    f.keys().find(|k| !allowed.contains(&k.as_str()))
}

/// The id a client sees for a tool call of `session`: the session travels in it, so the
/// request that brings the call's result finds the suspended turn without a header.
pub(crate) fn client_call_id(session: &str, call_id: &str) -> String {
    format!("hs_{}_{call_id}", hex_encode(session))
}

/// The session and the model's call id of a [`client_call_id`].
pub(crate) fn parse_call_id(id: &str) -> Option<(String, String)> {
    let (hex, call) = id.strip_prefix("hs_")?.split_once('_')?;
    if call.is_empty() {
        return None;
    }
    Some((hex_decode(hex)?, call.to_owned()))
}

#[cfg(test)]
#[path = "oai_request_tests.rs"]
mod tests;
