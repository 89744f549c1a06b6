//! The JSON Schema subset of reply formats: what OpenAI's structured outputs accept, plus
//! the common numeric, string and array bounds. [`check_schema`] refuses any other keyword
//! (honour or refuse: a keyword that is not checked would let a wrong reply through);
//! [`validate`] checks a value against an accepted schema.
//!
//! Checked: `type` (a name or a list), `properties`, `required`, `additionalProperties`
//! (a boolean or a schema), `minProperties`, `maxProperties`, `items`, `minItems`,
//! `maxItems`, `uniqueItems`, `enum`, `const`, `anyOf`, `oneOf`, `allOf`, `not`,
//! `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`,
//! `minLength`, `maxLength` (in characters), `pattern` (Rust `regex` syntax, unanchored),
//! and `$ref` to `#`, `#/$defs/NAME` or `#/definitions/NAME`. Annotations (`title`,
//! `description`, `default`, `examples`, `format`, `$schema`, `$id`, `$comment`,
//! `deprecated`, `readOnly`, `writeOnly`) are accepted and not checked, as the JSON Schema
//! specification makes `format` an annotation by default.

use serde_json::{Map, Value};

/// A keyword a schema uses that is not in the subset, or a place where a value does not
/// match its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// Where: a JSON pointer into the schema ([`check_schema`]) or into the value
    /// ([`validate`]); empty for the root.
    pub at: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.at.is_empty() { "/" } else { &self.at };
        write!(f, "at {at}: {}", self.message)
    }
}

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "format",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];

const CHECKED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "$ref",
];

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// How deep schemas may nest and `$ref`s may chain.
const MAX_DEPTH: usize = 64;

fn err(at: &str, message: impl Into<String>) -> SchemaError {
    SchemaError {
        at: at.to_owned(),
        message: message.into(),
    }
}

/// Whether `schema` uses only the subset (see the module docs); the first keyword or
/// value that is not, with its place in the schema.
pub fn check_schema(schema: &Value) -> Result<(), SchemaError> {
    check_at(schema, schema, "", 0)
}

fn check_at(root: &Value, s: &Value, at: &str, depth: usize) -> Result<(), SchemaError> {
    if depth > MAX_DEPTH {
        return Err(err(at, "the schema nests too deeply"));
    }
    let obj = match s {
        Value::Bool(_) => return Ok(()),
        Value::Object(o) => o,
        _ => return Err(err(at, "a schema must be an object or a boolean")),
    };
    for (k, v) in obj {
        let here = format!("{at}/{}", escape(k));
        if ANNOTATIONS.contains(&k.as_str()) {
            if k == "$defs" || k == "definitions" {
                let Value::Object(defs) = v else {
                    return Err(err(&here, "must be an object of schemas"));
                };
                for (name, d) in defs {
                    check_at(root, d, &format!("{here}/{}", escape(name)), depth + 1)?;
                }
            }
            continue;
        }
        if !CHECKED.contains(&k.as_str()) {
            return Err(err(
                &here,
                format!("the keyword `{k}` is not supported in a reply format's schema"),
            ));
        }
        match k.as_str() {
            "type" => {
                let names: Vec<&Value> = match v {
                    Value::Array(a) => a.iter().collect(),
                    one => vec![one],
                };
                for n in names {
                    if !n.as_str().is_some_and(|n| TYPES.contains(&n)) {
                        return Err(err(&here, format!("unknown type {n}")));
                    }
                }
            }
            "properties" => {
                let Value::Object(props) = v else {
                    return Err(err(&here, "must be an object of schemas"));
                };
                for (name, p) in props {
                    check_at(root, p, &format!("{here}/{}", escape(name)), depth + 1)?;
                }
            }
            "required" if !v.as_array().is_some_and(|a| a.iter().all(Value::is_string)) => {
                return Err(err(&here, "must be a list of property names"));
            }
            "additionalProperties" | "items" | "not" => check_at(root, v, &here, depth + 1)?,
            "anyOf" | "oneOf" | "allOf" => {
                let Some(list) = v.as_array().filter(|a| !a.is_empty()) else {
                    return Err(err(&here, "must be a non-empty list of schemas"));
                };
                for (i, sub) in list.iter().enumerate() {
                    check_at(root, sub, &format!("{here}/{i}"), depth + 1)?;
                }
            }
            "enum" if !v.is_array() => return Err(err(&here, "must be a list")),
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" if !v.is_number() => {
                return Err(err(&here, "must be a number"));
            }
            "multipleOf" if !v.as_f64().is_some_and(|m| m > 0.0) => {
                return Err(err(&here, "must be a number above 0"));
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties"
            | "maxProperties"
                if !v.is_u64() =>
            {
                return Err(err(&here, "must be a non-negative integer"));
            }
            "uniqueItems" if !v.is_boolean() => return Err(err(&here, "must be a boolean")),
            "pattern" => {
                let Some(p) = v.as_str() else {
                    return Err(err(&here, "must be a string"));
                };
                if let Err(e) = regex::Regex::new(p) {
                    return Err(err(&here, format!("not a regular expression: {e}")));
                }
            }
            "$ref" => {
                let Some(r) = v.as_str() else {
                    return Err(err(&here, "must be a string"));
                };
                if resolve(root, r).is_none() {
                    return Err(err(
                        &here,
                        format!(
                            "`{r}` does not name `#`, `#/$defs/NAME` or `#/definitions/NAME` of this schema"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    if r == "#" {
        return Some(root);
    }
    let (section, name) = r
        .strip_prefix("#/$defs/")
        .map(|n| ("$defs", n))
        .or_else(|| r.strip_prefix("#/definitions/").map(|n| ("definitions", n)))?;
    let name = name.replace("~1", "/").replace("~0", "~");
    root.get(section)?.get(name)
}

/// Checks `value` against `schema` (one that [`check_schema`] accepts); every place that
/// does not match.
pub fn validate(schema: &Value, value: &Value) -> Result<(), Vec<SchemaError>> {
    let mut errors = Vec::new();
    validate_at(schema, schema, value, "", 0, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn type_matches(name: &str, v: &Value) -> bool {
    match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    }
}

fn matches(root: &Value, s: &Value, v: &Value, depth: usize) -> bool {
    let mut errors = Vec::new();
    validate_at(root, s, v, "", depth, &mut errors);
    errors.is_empty()
}

fn validate_at(
    root: &Value,
    s: &Value,
    v: &Value,
    at: &str,
    depth: usize,
    out: &mut Vec<SchemaError>,
) {
    if depth > MAX_DEPTH {
        out.push(err(at, "the schema's references nest too deeply"));
        return;
    }
    let obj: &Map<String, Value> = match s {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            out.push(err(at, "no value is allowed here"));
            return;
        }
        Value::Object(o) => o,
        _ => return,
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        match resolve(root, r) {
            Some(target) => validate_at(root, target, v, at, depth + 1, out),
            None => out.push(err(at, format!("unresolved reference {r}"))),
        }
    }
    if let Some(t) = obj.get("type") {
        let names: Vec<&str> = match t {
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            Value::String(s) => vec![s.as_str()],
            _ => Vec::new(),
        };
        if !names.iter().any(|n| type_matches(n, v)) {
            out.push(err(
                at,
                format!("expected {}, got {}", names.join(" or "), kind(v)),
            ));
            return;
        }
    }
    if let Some(list) = obj.get("enum").and_then(Value::as_array)
        && !list.iter().any(|e| same(e, v))
    {
        out.push(err(
            at,
            format!("{} is not one of {}", short(v), Value::Array(list.clone())),
        ));
    }
    if let Some(c) = obj.get("const")
        && !same(c, v)
    {
        out.push(err(at, format!("expected {}", short(c))));
    }
    if let Some(list) = obj.get("anyOf").and_then(Value::as_array)
        && !list.iter().any(|sub| matches(root, sub, v, depth + 1))
    {
        out.push(err(at, "matches none of `anyOf`"));
    }
    if let Some(list) = obj.get("oneOf").and_then(Value::as_array) {
        let n = list
            .iter()
            .filter(|sub| matches(root, sub, v, depth + 1))
            .count();
        if n != 1 {
            out.push(err(at, format!("matches {n} of `oneOf`, not exactly one")));
        }
    }
    if let Some(list) = obj.get("allOf").and_then(Value::as_array) {
        for sub in list {
            validate_at(root, sub, v, at, depth + 1, out);
        }
    }
    if let Some(sub) = obj.get("not")
        && matches(root, sub, v, depth + 1)
    {
        out.push(err(at, "matches the schema of `not`"));
    }
    match v {
        Value::Object(o) => object(root, obj, o, at, depth, out),
        Value::Array(items) => {
            let n = items.len() as u64;
            if obj
                .get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| n < m)
            {
                out.push(err(at, format!("has {n} items, fewer than minItems")));
            }
            if obj
                .get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
            {
                out.push(err(at, format!("has {n} items, more than maxItems")));
            }
            if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
                for (i, a) in items.iter().enumerate() {
                    if items[..i].iter().any(|b| same(a, b)) {
                        out.push(err(&format!("{at}/{i}"), "repeats an earlier item"));
                    }
                }
            }
            if let Some(sub) = obj.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_at(root, sub, item, &format!("{at}/{i}"), depth + 1, out);
                }
            }
        }
        Value::String(text) => {
            let n = text.chars().count() as u64;
            if obj
                .get("minLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n < m)
            {
                out.push(err(
                    at,
                    format!("is {n} characters long, shorter than minLength"),
                ));
            }
            if obj
                .get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| n > m)
            {
                out.push(err(
                    at,
                    format!("is {n} characters long, longer than maxLength"),
                ));
            }
            if let Some(p) = obj.get("pattern").and_then(Value::as_str)
                && let Ok(re) = regex::Regex::new(p)
                && !re.is_match(text)
            {
                out.push(err(at, format!("does not match the pattern {p:?}")));
            }
        }
        Value::Number(num) => {
            if let Some(x) = num.as_f64() {
                let bound = |k: &str| obj.get(k).and_then(Value::as_f64);
                if bound("minimum").is_some_and(|m| x < m) {
                    out.push(err(at, format!("{x} is below the minimum")));
                }
                if bound("maximum").is_some_and(|m| x > m) {
                    out.push(err(at, format!("{x} is above the maximum")));
                }
                if bound("exclusiveMinimum").is_some_and(|m| x <= m) {
                    out.push(err(at, format!("{x} is not above the exclusive minimum")));
                }
                if bound("exclusiveMaximum").is_some_and(|m| x >= m) {
                    out.push(err(at, format!("{x} is not below the exclusive maximum")));
                }
                if let Some(m) = bound("multipleOf")
                    && m > 0.0
                    && ((x / m) - (x / m).round()).abs() > 1e-9
                {
                    out.push(err(at, format!("{x} is not a multiple of {m}")));
                }
            }
        }
        _ => {}
    }
}

fn object(
    root: &Value,
    schema: &Map<String, Value>,
    o: &Map<String, Value>,
    at: &str,
    depth: usize,
    out: &mut Vec<SchemaError>,
) {
    let n = o.len() as u64;
    if schema
        .get("minProperties")
        .and_then(Value::as_u64)
        .is_some_and(|m| n < m)
    {
        out.push(err(
            at,
            format!("has {n} properties, fewer than minProperties"),
        ));
    }
    if schema
        .get("maxProperties")
        .and_then(Value::as_u64)
        .is_some_and(|m| n > m)
    {
        out.push(err(
            at,
            format!("has {n} properties, more than maxProperties"),
        ));
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !o.contains_key(name) {
                out.push(err(at, format!("the property `{name}` is missing")));
            }
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for (name, value) in o {
        let here = format!("{at}/{}", escape(name));
        match props.and_then(|p| p.get(name)) {
            Some(sub) => validate_at(root, sub, value, &here, depth + 1, out),
            None => match schema.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    out.push(err(at, format!("the property `{name}` is not allowed")));
                }
                Some(sub @ Value::Object(_)) => {
                    validate_at(root, sub, value, &here, depth + 1, out);
                }
                _ => {}
            },
        }
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}
