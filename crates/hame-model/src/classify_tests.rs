use std::time::{Duration, SystemTime};

use hame_core::ModelError;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;

const OPENAI: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const ANTHROPIC: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
const DASHSCOPE: &str = r#"{"error":{"code":"invalid_parameter_error","param":null,"message":"<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 129024]","type":"invalid_request_error"},"id":"chatcmpl-1"}"#;
const DASHSCOPE_NATIVE: &str = r#"{"code":"InvalidParameter","message":"Range of input length should be [1, 30720]","request_id":"x"}"#;
const VLLM: &str = r#"{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 40000 tokens.","type":"BadRequestError","param":null,"code":400}"#;
const LLAMA_CPP: &str = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;

fn failure(status: u16, body: &str) -> HttpFailure<'_> {
    HttpFailure {
        status,
        body,
        retry_after: None,
        retry_after_ms: None,
        key_name: "OPENAI_API_KEY",
        key_sent: true,
        url: "http://127.0.0.1:1/v1",
    }
}

#[test]
fn overflow_bodies_of_every_provider() {
    for body in [
        OPENAI,
        ANTHROPIC,
        DASHSCOPE,
        DASHSCOPE_NATIVE,
        VLLM,
        LLAMA_CPP,
    ] {
        assert!(is_context_overflow_body(body), "{body}");
        assert!(
            classify_http(failure(400, body)).is_context_overflow(),
            "{body}"
        );
    }
}

#[test]
fn other_bad_requests_are_not_overflow() {
    for body in [
        r#"{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error","code":null}}"#,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}"#,
        "Bad Request",
    ] {
        assert!(!is_context_overflow_body(body), "{body}");
        assert!(matches!(
            classify_http(failure(400, body)),
            ModelError::Provider { status: 400, .. }
        ));
    }
}

#[test]
fn auth_names_the_key_and_url() {
    let e = classify_http(failure(
        401,
        r#"{"error":{"message":"Incorrect API key provided"}}"#,
    ));
    match e {
        ModelError::Auth { status, message } => {
            assert_eq!(status, 401);
            assert_eq!(
                message,
                "OPENAI_API_KEY was rejected by http://127.0.0.1:1/v1 (401): Incorrect API key provided"
            );
        }
        other => panic!("not auth: {other:?}"),
    }
    let unset = classify_http(HttpFailure {
        key_sent: false,
        ..failure(403, "forbidden")
    });
    assert!(
        unset
            .to_string()
            .contains("OPENAI_API_KEY is not set and http://127.0.0.1:1/v1 requires a key")
    );
    assert!(!unset.is_retryable());
}

#[test]
fn rate_limit_reads_retry_after() {
    let e = classify_http(HttpFailure {
        retry_after: Some("7"),
        ..failure(429, "{}")
    });
    assert!(
        matches!(e, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(7))
    );
    let ms = classify_http(HttpFailure {
        retry_after: Some("7"),
        retry_after_ms: Some("250"),
        ..failure(429, "{}")
    });
    assert!(
        matches!(ms, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_millis(250))
    );
    let none = classify_http(failure(429, "{}"));
    assert!(matches!(
        none,
        ModelError::RateLimited {
            retry_after: None,
            ..
        }
    ));
}

#[test]
fn server_errors_are_retryable_provider_errors() {
    for status in [500, 502, 503, 529] {
        let e = classify_http(failure(status, "oops"));
        assert!(matches!(e, ModelError::Provider { status: s, .. } if s == status));
        assert!(e.is_retryable());
    }
}

#[test]
fn retry_after_http_date() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
        Some(Duration::ZERO)
    );
    assert_eq!(
        parse_retry_after(" 12 ", now),
        Some(Duration::from_secs(12))
    );
    assert_eq!(
        parse_retry_after("1.5", now),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(parse_retry_after("-3", now), None);
}

#[test]
fn error_message_extraction() {
    assert_eq!(
        error_message(ANTHROPIC),
        "prompt is too long: 210000 tokens > 200000 maximum"
    );
    assert_eq!(
        error_message(DASHSCOPE_NATIVE),
        "Range of input length should be [1, 30720]"
    );
    assert_eq!(error_message("  plain text \n"), "plain text");
    assert_eq!(error_message(r#"{"error":"boom"}"#), "boom");
    let long = "é".repeat(3000);
    assert!(error_message(&long).chars().count() <= 1001);
}

#[test]
fn stream_errors() {
    assert!(classify_stream_error(ANTHROPIC).is_context_overflow());
    let overloaded = classify_stream_error(
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    assert!(matches!(
        overloaded,
        ModelError::Provider { status: 529, .. }
    ));
}

proptest! {
    #[test]
    fn retry_after_seconds_round_trip(secs in 0u64..10_000_000) {
        prop_assert_eq!(
            parse_retry_after(&secs.to_string(), SystemTime::now()),
            Some(Duration::from_secs(secs))
        );
    }

    #[test]
    fn classification_never_panics(status in 100u16..600, body in ".{0,200}") {
        let e = classify_http(failure(status, &body));
        if status == 401 || status == 403 {
            let is_auth = matches!(e, ModelError::Auth { .. });
            prop_assert!(is_auth, "not auth: {:?}", e);
        }
        if status == 429 {
            prop_assert!(e.is_retryable());
        }
    }
}
