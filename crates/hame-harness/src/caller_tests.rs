use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

fn person() -> serde_json::Value {
    json!({
        "type": "object",
        "title": "Person",
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "who"},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 2},
            "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}
        },
        "required": ["name", "age"],
        "additionalProperties": false,
        "$defs": {"Tag": {"type": "string", "enum": ["a", "b"]}}
    })
}

#[test]
fn a_pydantic_style_schema_is_accepted_and_checked() {
    let s = person();
    assert_eq!(check_schema(&s), Ok(()));
    assert_eq!(
        validate(&s, &json!({"name": "Ann", "age": 3, "tags": ["a"]})),
        Ok(())
    );
    let errors = validate(
        &s,
        &json!({"name": "", "age": -1.5, "tags": ["c", "a", "b"], "x": 1}),
    )
    .err()
    .unwrap_or_default();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        vec![
            "at /age: expected integer, got a number",
            "at /name: is 0 characters long, shorter than minLength",
            "at /tags: has 3 items, more than maxItems",
            "at /tags/0: \"c\" is not one of [\"a\",\"b\"]",
            "at /: the property `x` is not allowed",
        ]
    );
}

#[test]
fn unsupported_keywords_and_bad_references_are_refused_with_their_place() {
    let bad = json!({"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}});
    assert_eq!(
        check_schema(&bad).map_err(|e| e.to_string()),
        Err("at /properties/a/contentEncoding: the keyword `contentEncoding` is not supported in a reply format's schema".into())
    );
    let dangling = json!({"$ref": "#/$defs/Nope"});
    assert!(check_schema(&dangling).is_err());
    let remote = json!({"$ref": "https://example.com/s.json"});
    assert!(check_schema(&remote).is_err());
    assert!(check_schema(&json!({"type": "strange"})).is_err());
    assert!(check_schema(&json!({"pattern": "("})).is_err());
    assert!(check_schema(&json!(3)).is_err());
}

#[test]
fn recursive_references_terminate() {
    let tree = json!({
        "$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "$ref": "#/$defs/Node"
    });
    assert_eq!(check_schema(&tree), Ok(()));
    assert_eq!(validate(&tree, &json!({"kids": [{"kids": []}]})), Ok(()));
    let looping = json!({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"});
    assert!(validate(&looping, &json!(1)).is_err());
}

#[test]
fn reply_formats_accept_a_fenced_block_and_name_what_is_wrong() {
    let f = ReplyFormat::JsonSchema {
        name: "person".into(),
        schema: person(),
    };
    assert_eq!(
        f.check("```json\n{\"name\": \"A\", \"age\": 1}\n```"),
        Ok(json!({"name": "A", "age": 1}))
    );
    assert_eq!(
        f.check("{\"name\": \"A\"}"),
        Err("the reply does not match the schema: at /: the property `age` is missing".into())
    );
    assert!(f.check("Sure! Here it is").is_err());
    assert_eq!(ReplyFormat::JsonObject.check(" {} "), Ok(json!({})));
    assert!(ReplyFormat::JsonObject.check("[1]").is_err());
}

#[test]
fn a_caller_request_travels_in_the_context_extras() {
    let req = CallerRequest::default()
        .with_instructions(Some("be brief".into()))
        .with_params(Some(0.5), Some(100))
        .with_history(vec![Message::user("earlier")]);
    let ctx = req.clone().into_context(RuntimeContext::new("s"));
    assert_eq!(CallerRequest::of(&ctx), Some(req));
    assert_eq!(CallerRequest::of(&RuntimeContext::new("s")), None);
}

#[test]
fn client_outputs_become_results_or_errors() {
    assert_eq!(client_output(&json!({"output": "42"})), Ok("42".into()));
    assert_eq!(
        client_output(&json!({"output": {"a": 1}})),
        Ok("{\"a\":1}".into())
    );
    assert!(client_output(&json!({"output": "no", "is_error": true})).is_err());
}
