//! Errors that say what to do: dead and invalid URLs, credentials in URLs, huge
//! `Retry-After`, base URLs without `/v1`, replies cut off before any content.

use std::error::Error as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hame_core::{Model, ModelError, ModelParams, StopReason};
use hame_model::{
    AnthropicConfig, AnthropicModel, DEFAULT_TIMEOUT, OpenAiConfig, OpenAiModel, RetryConfig, open,
};
use hame_test_support::{Reply, ScriptReasoning, ScriptStep, ScriptStop, ScriptedServer};
use pretty_assertions::assert_eq;

use super::*;

/// The error and its sources, outermost first (what `{:#}` of anyhow prints, joined by ": ").
fn chain(e: &ModelError) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out
}

/// No part of the chain is repeated in the part before it.
fn assert_no_repetition(e: &ModelError) {
    let parts = chain(e);
    for pair in parts.windows(2) {
        assert!(
            !pair[0].contains(&pair[1]),
            "the cause is repeated in the message: {parts:?}"
        );
    }
}

/// A port on 127.0.0.1 that was just free: nothing listens there.
fn dead_port() -> Result<u16, std::io::Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn openai_at(base_url: String, retry: RetryConfig) -> Result<OpenAiModel, ModelError> {
    OpenAiModel::new(OpenAiConfig {
        base_url,
        retry,
        ..OpenAiConfig::new("gpt-4o-mini")
    })
}

fn anthropic_at(base_url: String, retry: RetryConfig) -> Result<AnthropicModel, ModelError> {
    AnthropicModel::new(AnthropicConfig {
        base_url,
        retry,
        ..AnthropicConfig::new("claude-sonnet-4-5")
    })
}

#[tokio::test]
async fn a_dead_url_fails_fast_with_one_clear_message() -> TestResult {
    let port = dead_port()?;
    // The real default retry policy (4 retries, 500 ms doubling): connection failures
    // still get only two short retries.
    let openai = openai_at(
        format!("http://127.0.0.1:{port}/v1"),
        RetryConfig::default(),
    )?;
    let anthropic = anthropic_at(format!("http://127.0.0.1:{port}"), RetryConfig::default())?;
    for (m, base, var) in [
        (
            &openai as &dyn Model,
            format!("http://127.0.0.1:{port}/v1"),
            "OPENAI_BASE_URL",
        ),
        (
            &anthropic,
            format!("http://127.0.0.1:{port}"),
            "ANTHROPIC_BASE_URL",
        ),
    ] {
        let started = Instant::now();
        let err = m.complete(request("x")).await.err().ok_or("no error")?;
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
        assert!(matches!(err, ModelError::Transport { .. }), "{err:?}");
        let ModelError::Transport { message, .. } = &err else {
            unreachable!()
        };
        // A refused connection on a loopback address cannot succeed on a retry: one
        // attempt, said at once.
        assert_eq!(
            message,
            &format!(
                "cannot connect to {base} (connection refused); check that the server is \
                 running and that {var} has the right host and port"
            ),
        );
        assert_no_repetition(&err);
        // The cause is in the chain, once.
        let all = chain(&err).join(": ");
        assert_eq!(all.matches("Connection refused").count(), 1, "{all}");
    }
    Ok(())
}

#[tokio::test]
async fn an_invalid_url_is_a_config_error_before_any_request() -> TestResult {
    let server = ScriptedServer::start().await?;
    let port = server.addr().port();
    for raw in [
        format!("http://127.0.0.1:{port}0000/v1"),
        format!("127.0.0.1:{port}/v1"),
        format!("localhost:{port}/v1"),
    ] {
        let err = openai_at(raw.clone(), RetryConfig::default())
            .err()
            .ok_or("no error")?;
        let ModelError::Config(message) = &err else {
            return Err(format!("{raw}: not a config error: {err:?}").into());
        };
        assert!(message.starts_with("OPENAI_BASE_URL "), "{message}");
        assert!(message.contains(&raw), "{message}");
        let err = anthropic_at(raw.clone(), RetryConfig::default())
            .err()
            .ok_or("no error")?;
        assert!(
            matches!(&err, ModelError::Config(m) if m.starts_with("ANTHROPIC_BASE_URL ")),
            "{err:?}"
        );
    }
    let bad_port = openai_at(format!("http://127.0.0.1:{port}0000/v1"), fast_retry(3))
        .err()
        .ok_or("no error")?;
    assert!(
        bad_port.to_string().contains("invalid port number"),
        "{bad_port}"
    );
    assert_no_repetition(&bad_port);
    // Through `open`, the message names the variable that was read.
    let base = format!("http://127.0.0.1:{port}0000/v1");
    let env = move |k: &str| (k == "DASHSCOPE_BASE_URL").then(|| base.clone());
    let err = open("dashscope:qwen-max", &env).err().ok_or("no error")?;
    assert!(
        matches!(&err, ModelError::Config(m) if m.starts_with("DASHSCOPE_BASE_URL is not a valid URL")),
        "{err:?}"
    );
    assert_eq!(server.request_count(), 0);
    Ok(())
}

#[tokio::test]
async fn credentials_in_the_url_never_appear_in_messages() -> TestResult {
    let server = ScriptedServer::start().await?;
    let addr = server.addr();
    let port = dead_port()?;
    let secret = "s3cret-pw";
    for kind in BOTH {
        let (live, dead) = match kind {
            Kind::OpenAi => (
                format!("http://alice:{secret}@{addr}/v1"),
                format!("http://alice:{secret}@127.0.0.1:{port}/v1"),
            ),
            Kind::Anthropic => (
                format!("http://alice:{secret}@{addr}"),
                format!("http://alice:{secret}@127.0.0.1:{port}"),
            ),
        };
        let build = |base_url: String| -> Result<Arc<dyn Model>, ModelError> {
            Ok(match kind {
                Kind::OpenAi => Arc::new(openai_at(base_url, fast_retry(2))?),
                Kind::Anthropic => Arc::new(anthropic_at(base_url, fast_retry(2))?),
            })
        };
        let m = build(live)?;
        server.push(ScriptStep::unauthorized());
        for _ in 0..3 {
            server.push(ScriptStep::error(503, "busy"));
        }
        let mut errors = vec![
            m.complete(request("x")).await.err().ok_or("no error")?,
            m.complete(request("x")).await.err().ok_or("no error")?,
        ];
        errors.push(
            build(dead)?
                .complete(request("x"))
                .await
                .err()
                .ok_or("no error")?,
        );
        errors.push(
            build(format!("http://alice:{secret}@127.0.0.1:{port}0000"))
                .err()
                .ok_or("no error")?,
        );
        assert!(matches!(errors[0], ModelError::Auth { .. }), "{errors:?}");
        // The URL is named, without its credentials.
        assert!(
            errors[0]
                .to_string()
                .contains(&format!(" http://***@{addr}")),
            "{}",
            errors[0]
        );
        for e in &errors {
            let text = format!("{} {e:?}", chain(e).join(": "));
            assert!(!text.contains(secret), "{kind:?}: {text}");
        }
        let debug = format!("{m:?}");
        assert!(!debug.contains(secret), "{debug}");
    }
    // The credentials were used: sent as basic auth (`alice:s3cret-pw`).
    let reqs = server.requests();
    assert_eq!(
        reqs.last().and_then(|r| r.header("authorization")),
        Some("Basic YWxpY2U6czNjcmV0LXB3")
    );
    Ok(())
}

#[tokio::test]
async fn a_huge_retry_after_is_not_slept() -> TestResult {
    for kind in BOTH {
        let server = ScriptedServer::start().await?;
        server.push(ScriptStep::rate_limited(100_000));
        server.push(ScriptStep::text("never"));
        let m = model(kind, &server, RetryConfig::default(), DEFAULT_TIMEOUT)?;
        let started = Instant::now();
        let err = m.complete(request("x")).await.err().ok_or("no error")?;
        assert!(started.elapsed() < Duration::from_secs(1));
        let ModelError::RateLimited {
            retry_after,
            message,
        } = &err
        else {
            return Err(format!("{kind:?}: {err:?}").into());
        };
        assert_eq!(*retry_after, Some(Duration::from_secs(100_000)));
        assert!(
            message.ends_with(
                "; the server asks to wait 27 h 46 min, longer than the 1 min this client \
                 waits (RetryConfig::max_retry_after), so it gave up at once"
            ),
            "{message}"
        );
        assert_eq!(server.request_count(), 1, "{kind:?}");
    }
    Ok(())
}

#[tokio::test]
async fn base_urls_with_or_without_v1_reach_the_endpoint() -> TestResult {
    let server = ScriptedServer::start().await?;
    let root = server.url();
    for base in [root.clone(), format!("{root}/")] {
        server.push(ScriptStep::text("openai without /v1"));
        let m = openai_at(base, fast_retry(0))?;
        assert_eq!(
            m.complete(request("x")).await?.message.text_content(),
            "openai without /v1"
        );
    }
    server.push(ScriptStep::text("anthropic with /v1"));
    let m = anthropic_at(format!("{root}/v1"), fast_retry(0))?;
    assert_eq!(
        m.complete(request("x")).await?.message.text_content(),
        "anthropic with /v1"
    );
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/messages"
        ]
    );
    Ok(())
}

/// A reply that stopped at the output limit: reasoning only, or some text.
fn cut_off(text: Option<&str>) -> ScriptStep {
    ScriptStep::from(Reply::Message {
        reasoning: Some(ScriptReasoning {
            text: "Let me think about this at length".into(),
            signature: None,
        }),
        text: text.map(str::to_owned),
        tool_calls: Vec::new(),
        stop: Some(ScriptStop::MaxTokens),
    })
    .with_usage(20, 64)
}

#[tokio::test]
async fn a_reply_cut_off_before_any_content_is_an_error() -> TestResult {
    for kind in BOTH {
        let server = ScriptedServer::start().await?;
        let m = default_model(kind, &server)?;
        let mut req = request("x");
        req.params = ModelParams {
            temperature: None,
            max_tokens: Some(64),
        };
        server.push(cut_off(None));
        let streamed = stream_events(m.as_ref(), req.clone())
            .await
            .err()
            .ok_or("no error")?;
        server.push(cut_off(None));
        let whole = m.complete(req.clone()).await.err().ok_or("no error")?;
        for err in [streamed, whole] {
            let ModelError::InvalidResponse(message) = &err else {
                return Err(format!("{kind:?}: {err:?}").into());
            };
            assert_eq!(
                message,
                "the model hit the output token limit (max_tokens 64, 64 output tokens used) \
                 before writing any text or tool call (its reasoning used them all); raise \
                 max_tokens",
                "{kind:?}"
            );
            assert!(!err.is_retryable());
        }
        // Cut off after some text: a partial reply, as before.
        server.push(cut_off(Some("The answer is")));
        let events = stream_events(m.as_ref(), req.clone()).await?;
        let r = assemble(&events);
        assert_eq!(r.message.text_content(), "The answer is");
        assert_eq!(r.stop_reason, Some(StopReason::MaxTokens));
        server.push(cut_off(Some("The answer is")));
        let r = m.complete(req).await?;
        assert_eq!(r.stop_reason, Some(StopReason::MaxTokens));
        assert_eq!(server.request_count(), 4, "{kind:?}");
    }
    // Anthropic names its default limit when the request sets none.
    let server = ScriptedServer::start().await?;
    server.push(cut_off(None));
    let m = default_model(Kind::Anthropic, &server)?;
    let err = m.complete(request("x")).await.err().ok_or("no error")?;
    assert!(
        err.to_string()
            .contains("(max_tokens 8192, 64 output tokens used)"),
        "{err}"
    );
    Ok(())
}
