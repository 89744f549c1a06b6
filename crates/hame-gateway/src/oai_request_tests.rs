use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

fn taken() -> Vec<String> {
    vec!["read_file".to_owned()]
}

fn refusal(body: Value) -> (String, String) {
    match parse_chat(&body, &taken()) {
        Ok(p) => panic!("accepted: {p:?}"),
        Err(r) => (r.code.to_owned(), r.param),
    }
}

#[test]
fn every_unknown_or_unhonoured_field_is_refused_by_name() {
    let base = |extra: Value| {
        let mut b = json!({"model": "hame", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        b
    };
    for (extra, param) in [
        (json!({"frobnicate": 1}), "frobnicate"),
        (json!({"n": 2}), "n"),
        (json!({"top_p": 0.5}), "top_p"),
        (json!({"user": "bob"}), "user"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"parallel_tool_calls": false}), "parallel_tool_calls"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"stream": true, "stream_options": {"other": true}}),
            "stream_options.other",
        ),
        (
            json!({"tools": [{"type": "custom", "name": "x"}]}),
            "tools[0].type",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "date", "contentMediaType": "x"}}}}),
            "response_format.json_schema.schema",
        ),
    ] {
        assert_eq!(
            refusal(base(extra.clone())),
            ("unsupported_parameter".to_owned(), param.to_owned()),
            "{extra}"
        );
    }
    // Defaults and nulls are fine.
    let ok = base(
        json!({"n": 1, "top_p": 1, "user": null, "logprobs": false, "parallel_tool_calls": true, "store": false, "tool_choice": "auto"}),
    );
    assert!(parse_chat(&ok, &taken()).is_ok());
}

#[test]
fn a_non_boolean_stream_and_stream_options_without_stream_are_invalid() {
    let b =
        json!({"model": "hame", "stream": "yes", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        refusal(b),
        ("invalid_value".to_owned(), "stream".to_owned())
    );
    let b = json!({"model": "hame", "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        refusal(b),
        ("invalid_value".to_owned(), "stream_options".to_owned())
    );
    let b = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        refusal(b),
        ("missing_required_parameter".to_owned(), "model".to_owned())
    );
}

/// A 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn png_url() -> String {
    format!("data:image/png;base64,{PNG}")
}

fn png() -> ContentBlock {
    ContentBlock::Image(ImageBlock {
        media_type: "image/png".into(),
        data: PNG.into(),
    })
}

/// The refusal of a user message with `part` after a text part: (code, param, message).
fn image_refusal(part: Value) -> (String, String, String) {
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "see"}, part]}
    ]});
    match parse_chat(&b, &taken()) {
        Ok(p) => panic!("accepted: {p:?}"),
        Err(r) => (r.code.to_owned(), r.param, r.message),
    }
}

#[test]
fn a_data_url_image_becomes_an_image_block_of_the_user_message() -> Result<(), Refusal> {
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "what is"},
            {"type": "text", "text": "this?"},
            {"type": "image_url", "image_url": {"url": png_url(), "detail": "auto"}},
            {"type": "image_url", "image_url": png_url().replace("data:image/png;base64", "DATA:Image/PNG;base64")}
        ]}
    ]});
    let p = parse_chat(&b, &taken())?;
    let Tail::User(m) = p.tail else {
        panic!("not a user tail: {:?}", p.tail)
    };
    assert_eq!(
        m.content.to_vec(),
        vec![
            ContentBlock::Text {
                text: "what is\nthis?".into()
            },
            png(),
            png()
        ]
    );
    // A message of images only is a turn too.
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_url()}}]}
    ]});
    let p = parse_chat(&b, &taken())?;
    assert_eq!(
        p.tail,
        Tail::User(Message {
            role: Role::User,
            content: vec![png()].into(),
            usage: None
        })
    );
    Ok(())
}

/// Every URL that is not an inline image of an accepted type, in every hostile spelling:
/// refused with its place, and the advice to send a data: URL.
#[test]
fn image_urls_other_than_inline_images_are_refused_with_their_place() {
    let at = "messages[0].content[1].image_url.url";
    let unsupported = "unsupported_parameter";
    let invalid = "invalid_value";
    for (url, code) in [
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            unsupported,
        ),
        ("https://example.com/cat.png".to_owned(), unsupported),
        ("HTTPS://example.com/cat.png".to_owned(), unsupported),
        ("file:///etc/passwd".to_owned(), unsupported),
        ("ftp://example.com/a.png".to_owned(), unsupported),
        ("//example.com/a.png".to_owned(), unsupported),
        ("cat.png".to_owned(), unsupported),
        (String::new(), unsupported),
        (" data:image/png;base64,AAAA".to_owned(), unsupported),
        (
            "data:text/html;base64,PGgxPmhpPC9oMT4=".to_owned(),
            unsupported,
        ),
        ("data:image/svg+xml;base64,PHN2Zy8+".to_owned(), unsupported),
        ("data:image/png,rawbytes".to_owned(), unsupported),
        (
            "data:image/png;charset=utf-8;base64,AAAA".to_owned(),
            unsupported,
        ),
        ("data:image/png;base64".to_owned(), invalid),
        ("data:image/png;base64,not base64!".to_owned(), invalid),
        ("data:image/png;base64,iVBORw0KGgo".to_owned(), invalid),
        (format!("data:image/png;base64,{PNG}\n"), invalid),
        // Valid base64, but not a PNG (HTML) / a GIF said to be a PNG.
        ("data:image/png;base64,PGgxPmhpPC9oMT4=".to_owned(), invalid),
        (
            "data:image/png;base64,R0lGODlhAQABAAAAACw=".to_owned(),
            invalid,
        ),
    ] {
        let (c, param, message) =
            image_refusal(json!({"type": "image_url", "image_url": {"url": url}}));
        assert_eq!(
            (c.as_str(), param.as_str()),
            (code, at),
            "{url:?}: {message}"
        );
        assert!(
            message.contains("data:") || message.contains("the data is not image/png"),
            "{url:?}: {message}"
        );
    }
    // The string form names its own place.
    let (_, param, message) =
        image_refusal(json!({"type": "image_url", "image_url": "https://example.com/a.png"}));
    assert_eq!(param, "messages[0].content[1].image_url");
    assert!(
        message.contains("send the image inline as a data: URL"),
        "{message}"
    );
}

#[test]
fn image_fields_sizes_and_places_are_checked() {
    let big = {
        use base64::Engine as _;
        let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        bytes.resize(MAX_IMAGE_BYTES + 1, 0);
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    };
    for (part, code, param) in [
        (
            json!({"type": "image_url", "image_url": {"url": big}}),
            "invalid_value",
            "messages[0].content[1].image_url.url",
        ),
        (
            json!({"type": "image_url", "image_url": {"url": png_url(), "detail": "high"}}),
            "unsupported_parameter",
            "messages[0].content[1].image_url.detail",
        ),
        (
            json!({"type": "image_url", "image_url": {"url": png_url(), "detail": "max"}}),
            "invalid_value",
            "messages[0].content[1].image_url.detail",
        ),
        (
            json!({"type": "image_url", "image_url": {"url": png_url(), "format": "png"}}),
            "unsupported_parameter",
            "messages[0].content[1].image_url.format",
        ),
        (
            json!({"type": "image_url", "image_url": {"detail": "auto"}}),
            "missing_required_parameter",
            "messages[0].content[1].image_url.url",
        ),
        (
            json!({"type": "image_url", "image_url": 7}),
            "invalid_value",
            "messages[0].content[1].image_url",
        ),
        (
            json!({"type": "input_image", "file_id": "file-abc"}),
            "unsupported_parameter",
            "messages[0].content[1].file_id",
        ),
        (
            json!({"type": "input_audio", "input_audio": {}}),
            "unsupported_parameter",
            "messages[0].content[1].type",
        ),
    ] {
        let (c, p, message) = image_refusal(part.clone());
        assert_eq!((c.as_str(), p.as_str()), (code, param), "{message}");
    }
    // 20 images pass; the 21st (history included) is refused.
    let images = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|_| json!({"type": "image_url", "image_url": {"url": png_url()}}))
            .collect()
    };
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": images(MAX_IMAGES - 1)},
        {"role": "assistant", "content": "two?"},
        {"role": "user", "content": images(1)}
    ]});
    assert!(parse_chat(&b, &taken()).is_ok());
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": images(MAX_IMAGES)},
        {"role": "assistant", "content": "two?"},
        {"role": "user", "content": images(1)}
    ]});
    assert_eq!(
        refusal(b),
        ("invalid_value".to_owned(), "messages".to_owned())
    );
    // An image anywhere but in a user message.
    for role in ["assistant", "system", "developer", "tool"] {
        let mut m = json!({"role": role, "content": [{"type": "image_url", "image_url": {"url": png_url()}}]});
        if role == "tool" {
            m["tool_call_id"] = json!("c1");
        }
        let b = json!({"model": "hame", "messages": [{"role": "user", "content": "hi"}, m, {"role": "user", "content": "so?"}]});
        assert_eq!(
            refusal(b),
            (
                "unsupported_parameter".to_owned(),
                "messages[1].content[0]".to_owned()
            ),
            "{role}"
        );
    }
}

#[test]
fn other_parts_fields_and_roles_are_refused_with_their_place() {
    let b = json!({"model": "hame", "messages": [{"role": "user", "content": "x", "name": "bob"}]});
    assert_eq!(
        refusal(b),
        (
            "unsupported_parameter".to_owned(),
            "messages[0].name".to_owned()
        )
    );
    let b = json!({"model": "hame", "messages": [{"role": "function", "content": "x"}]});
    assert_eq!(
        refusal(b),
        (
            "unsupported_parameter".to_owned(),
            "messages[0].role".to_owned()
        )
    );
}

#[test]
fn system_history_tools_and_format_are_read() -> Result<(), Refusal> {
    let b = json!({
        "model": "hame",
        "temperature": 0.2,
        "max_completion_tokens": 50,
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Use metric units."}]},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "5 C"},
            {"role": "assistant", "content": "5 C in Oslo"},
            {"role": "user", "content": "and tomorrow?"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}}
    });
    let p = parse_chat(&b, &taken())?;
    assert_eq!(
        p.instructions.as_deref(),
        Some("Be terse.\n\nUse metric units.")
    );
    assert_eq!(p.tail, Tail::User(Message::user("and tomorrow?")));
    assert_eq!(p.history.len(), 4);
    assert_eq!(p.history[1].tool_calls().count(), 1);
    assert_eq!(p.history[2].tool_results_iter().count(), 1);
    assert_eq!(p.tools.len(), 1);
    assert!(p.tools[0].strict);
    assert_eq!(p.temperature, Some(0.2));
    assert_eq!(p.max_tokens, Some(50));
    assert!(matches!(
        p.reply_format,
        Some(ReplyFormat::JsonSchema { .. })
    ));
    Ok(())
}

#[test]
fn trailing_tool_messages_are_the_tail_and_a_taken_name_is_refused() -> Result<(), Refusal> {
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "2"}]}
    ]});
    let p = parse_chat(&b, &taken())?;
    assert_eq!(
        p.tail,
        Tail::ToolResults(vec![("a".into(), "1".into()), ("b".into(), "2".into())])
    );
    assert_eq!(p.history.len(), 2);
    let b = json!({"model": "hame", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "read_file"}}]});
    assert_eq!(
        refusal(b),
        (
            "invalid_value".to_owned(),
            "tools[0].function.name".to_owned()
        )
    );
    let b = json!({"model": "hame", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]});
    assert_eq!(
        refusal(b),
        ("invalid_value".to_owned(), "messages".to_owned())
    );
    Ok(())
}

#[test]
fn client_call_ids_carry_their_session() {
    let id = client_call_id("chatcmpl-abc.d@e", "call_X_1");
    assert_eq!(
        parse_call_id(&id),
        Some(("chatcmpl-abc.d@e".into(), "call_X_1".into()))
    );
    for bad in ["call_1", "hs_", "hs_zz_c", "hs_616_c", "hs_61_", "hs_ff_c"] {
        assert_eq!(parse_call_id(bad), None, "{bad}");
    }
}
