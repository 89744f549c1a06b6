//! Endpoints that are not models fail fast and say why (issue #36): a web page is one line
//! naming the URL, the status and the content type, never retried; a server that accepts
//! and says nothing fails after the first-byte timeout, retries included; no key for a
//! provider's default endpoint names the key's variable before any request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hame_core::{Model, ModelError};
use hame_model::{
    AnthropicConfig, AnthropicModel, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_BYTE_TIMEOUT,
    OpenAiConfig, OpenAiModel, RetryConfig, open,
};
use hame_test_support::{ScriptStep, ScriptedServer};

use super::*;

fn both(base: &str, retry: RetryConfig) -> Result<Vec<Arc<dyn Model>>, ModelError> {
    Ok(vec![
        Arc::new(OpenAiModel::new(OpenAiConfig {
            base_url: format!("{base}/v1"),
            api_key: Some("k".into()),
            retry: retry.clone(),
            ..OpenAiConfig::new("m")
        })?),
        Arc::new(AnthropicModel::new(AnthropicConfig {
            base_url: base.to_owned(),
            api_key: Some("k".into()),
            retry,
            ..AnthropicConfig::new("claude-x")
        })?),
    ])
}

#[tokio::test]
async fn a_web_page_is_one_line_and_never_retried() -> TestResult {
    for status in [501, 200, 404, 503] {
        let server = ScriptedServer::start().await?;
        let base = server.url();
        // The default retry policy: a 5xx model error would be retried four times.
        for m in both(&base, RetryConfig::default())? {
            for streaming in [false, true] {
                server.push(ScriptStep::html_page(status, "Directory\n listing"));
                let before = server.request_count();
                let started = Instant::now();
                let err = if streaming {
                    m.stream(request("x")).await.err()
                } else {
                    m.complete(request("x")).await.err()
                }
                .ok_or("no error")?;
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "{status}: {err}"
                );
                assert!(!err.is_retryable(), "{err:?}");
                assert_eq!(server.request_count(), before + 1, "{status}: retried");
                let text = err.to_string();
                assert!(!text.contains('\n'), "{text}");
                assert!(text.contains(&format!("{base}/v1/")), "{text}");
                assert!(
                    text.contains(&format!("answered HTTP {status} (text/html, ")),
                    "{text}"
                );
                assert!(text.contains("title \"Directory listing\""), "{text}");
                assert!(
                    text.ends_with("not a model API's JSON; check OPENAI_BASE_URL")
                        || text.ends_with("not a model API's JSON; check ANTHROPIC_BASE_URL"),
                    "{text}"
                );
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_server_that_never_answers_fails_after_the_first_byte_timeout() -> TestResult {
    assert_eq!(DEFAULT_FIRST_BYTE_TIMEOUT, Duration::from_secs(25));
    assert!(DEFAULT_CONNECT_TIMEOUT <= DEFAULT_FIRST_BYTE_TIMEOUT);
    assert_eq!(
        OpenAiConfig::new("m").first_byte_timeout,
        DEFAULT_FIRST_BYTE_TIMEOUT
    );
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let base = format!("http://{}", silent.local_addr()?);
    let env = move |k: &str| match k {
        "OPENAI_BASE_URL" => Some(format!("{base}/v1")),
        "HAME_MODEL_TIMEOUT" => Some("0.6".to_owned()),
        _ => None,
    };
    // The default retry policy and idle timeout (120 s): the deadline still holds.
    let m = open("openai:m", &env)?;
    let started = Instant::now();
    let err = m.complete(request("x")).await.err().ok_or("no error")?;
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(600), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let text = err.to_string();
    assert!(
        text.contains("no response from http://127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains("within 600 ms; check OPENAI_BASE_URL, or for a slow model raise the first-byte timeout (model_timeout in hame.toml, --model-timeout)"), "{text}");
    // A timeout that is not one is a configuration error naming the variable.
    let bad = |k: &str| match k {
        "OPENAI_BASE_URL" => Some("http://127.0.0.1:9/v1".to_owned()),
        "HAME_MODEL_CONNECT_TIMEOUT" => Some("soon".to_owned()),
        _ => None,
    };
    let err = open("openai:m", &bad).err().ok_or("no error")?;
    assert!(
        matches!(&err, ModelError::Config(m) if m.starts_with("HAME_MODEL_CONNECT_TIMEOUT=\"soon\" is not a timeout")),
        "{err:?}"
    );
    drop(silent);
    Ok(())
}

#[tokio::test]
async fn no_key_for_a_default_endpoint_names_the_key_not_the_url() -> TestResult {
    let nothing = |_: &str| None;
    for (spec, var) in [
        ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("dashscope:qwen-max", "DASHSCOPE_API_KEY"),
    ] {
        // Opening works (commands that never call the model need no key); the first
        // request fails before anything is sent.
        let m = open(spec, &nothing)?;
        let started = Instant::now();
        let err = m.complete(request("x")).await.err();
        assert!(started.elapsed() < Duration::from_millis(500));
        let Some(ModelError::Config(message)) = &err else {
            return Err(format!("{spec}: {err:?}").into());
        };
        assert!(
            message.starts_with(&format!("{var} is not set: https://")),
            "{message}"
        );
        assert!(!message.contains("BASE_URL is"), "{message}");
    }
    // A local server needs no key; neither does an endpoint that was set.
    assert!(!hame_model::needs_key("http://127.0.0.1:11434/v1"));
    assert!(!hame_model::needs_key("http://127.0.0.1:8000/v1"));
    assert!(hame_model::needs_key("https://api.openai.com/v1/"));
    assert!(hame_model::is_default_endpoint("http://127.0.0.1:11434/v1"));
    assert!(!hame_model::is_default_endpoint("http://127.0.0.1:8000/v1"));
    Ok(())
}
