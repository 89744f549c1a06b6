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

#[test]
fn images_and_other_parts_are_refused_with_their_place() {
    let b = json!({"model": "hame", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
    ]});
    assert_eq!(
        refusal(b),
        (
            "unsupported_parameter".to_owned(),
            "messages[0].content[1]".to_owned()
        )
    );
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
    assert_eq!(p.tail, Tail::User("and tomorrow?".into()));
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
