//! Classification of provider failures into [`ModelError`]. Pure functions, no HTTP types.

use std::time::{Duration, SystemTime};

use hame_core::{ModelError, secrets};
use serde_json::Value;

/// Message fragments (lowercase) that mean "the prompt does not fit the context window".
///
/// OpenAI and vLLM: "maximum context length"; Anthropic: "prompt is too long";
/// DashScope/Qwen: "range of input length should be"; llama.cpp: "exceeds the available
/// context size"; Volcano Engine and others: "input length … exceeds the maximum length".
const OVERFLOW_PHRASES: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "range of input length should be",
    "exceeds the available context size",
    "exceed_context_size_error",
    "context window is full",
    "input is too long",
];

/// Error codes (lowercase) that mean context overflow.
const OVERFLOW_CODES: &[&str] = &[
    "context_length_exceeded",
    "exceed_context_size_error",
    "string_above_max_length",
];

/// Whether an error body (JSON or text) says the prompt exceeds the context window.
///
/// Recognises the OpenAI body (`error.code = "context_length_exceeded"`), the Anthropic
/// body (`prompt is too long: N tokens > M maximum`), DashScope's compatible-mode and
/// native bodies (`Range of input length should be [1, N]`), vLLM and llama.cpp.
pub fn is_context_overflow_body(body: &str) -> bool {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        let codes = [
            v.pointer("/error/code"),
            v.pointer("/error/type"),
            v.pointer("/code"),
            v.pointer("/type"),
        ];
        if codes
            .iter()
            .flatten()
            .filter_map(|c| c.as_str())
            .any(|c| OVERFLOW_CODES.contains(&c.to_ascii_lowercase().as_str()))
        {
            return true;
        }
    }
    let lower = body.to_ascii_lowercase();
    OVERFLOW_PHRASES.iter().any(|p| lower.contains(p))
        || (lower.contains("input length") && lower.contains("exceeds the maximum"))
}

/// The human-readable message of an error body: `error.message`, `message`, or the text.
pub fn error_message(body: &str) -> String {
    const LIMIT: usize = 2_000;
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        [v.pointer("/error/message"), v.pointer("/message")]
            .into_iter()
            .flatten()
            .find_map(|m| m.as_str().map(str::to_owned))
            .or_else(|| v.get("error").and_then(Value::as_str).map(str::to_owned))
    });
    let text = from_json.unwrap_or_else(|| body.trim().to_owned());
    if text.len() > LIMIT {
        let mut end = LIMIT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &text[..end])
    } else {
        text
    }
}

/// Parses a `Retry-After` value: delay-seconds (`"7"`, `"1.5"`) or an HTTP-date.
///
/// A date in the past gives zero. Garbage gives `None`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What is known about a failed HTTP exchange.
#[derive(Debug, Clone, Copy)]
pub struct HttpFailure<'a> {
    /// HTTP status.
    pub status: u16,
    /// Response body as text.
    pub body: &'a str,
    /// The `Retry-After` header.
    pub retry_after: Option<&'a str>,
    /// The `retry-after-ms` header (OpenAI).
    pub retry_after_ms: Option<&'a str>,
    /// Where the key came from, named in auth errors (`OPENAI_API_KEY`).
    pub key_name: &'a str,
    /// Whether a key was sent.
    pub key_sent: bool,
    /// The base URL, named in auth errors.
    pub url: &'a str,
}

/// Turns a non-success HTTP response into a [`ModelError`].
///
/// 401/403 → [`ModelError::Auth`] naming the key; 429 → [`ModelError::RateLimited`];
/// an overflow body (any 4xx, or 5xx for servers that misreport it) →
/// [`ModelError::ContextOverflow`]; everything else → [`ModelError::Provider`].
///
/// The body is redacted first (`hame_core::secrets`): a provider that echoes the key it
/// refused does not put it into the error.
pub fn classify_http(f: HttpFailure<'_>) -> ModelError {
    let body = secrets::redact(f.body);
    let message = error_message(&body);
    match f.status {
        401 | 403 => ModelError::Auth {
            status: f.status,
            message: if f.key_sent {
                format!(
                    "{} was rejected by {} ({}): {message}",
                    f.key_name, f.url, f.status
                )
            } else {
                format!(
                    "{} is not set and {} requires a key ({}): {message}",
                    f.key_name, f.url, f.status
                )
            },
        },
        429 => {
            let now = SystemTime::now();
            let retry_after = f
                .retry_after_ms
                .and_then(|ms| ms.trim().parse::<f64>().ok())
                .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
                .or_else(|| f.retry_after.and_then(|v| parse_retry_after(v, now)));
            ModelError::RateLimited {
                retry_after,
                message,
            }
        }
        _ if is_context_overflow_body(&body) => ModelError::ContextOverflow { message },
        status => ModelError::Provider {
            status,
            body: body.into_owned(),
        },
    }
}

/// Classifies an error object sent inside a stream (after a 200 status); redacted as
/// [`classify_http`] does.
pub fn classify_stream_error(body: &str) -> ModelError {
    let body = &*secrets::redact(body);
    if is_context_overflow_body(body) {
        return ModelError::ContextOverflow {
            message: error_message(body),
        };
    }
    let lower = body.to_ascii_lowercase();
    let status = if lower.contains("overloaded") {
        529
    } else if lower.contains("rate_limit") {
        429
    } else {
        500
    };
    if status == 429 {
        return ModelError::RateLimited {
            retry_after: None,
            message: error_message(body),
        };
    }
    ModelError::Provider {
        status,
        body: body.to_owned(),
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
