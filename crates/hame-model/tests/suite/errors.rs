//! Error classification and retries, for both providers.

use std::time::Duration;

use futures::StreamExt;
use hame_core::ModelError;
use hame_model::RetryConfig;
use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::*;

/// A scripted server that answers `steps`, in order.
async fn answering(
    steps: impl IntoIterator<Item = ScriptStep>,
) -> Result<ScriptedServer, Box<dyn std::error::Error>> {
    let server = ScriptedServer::start().await?;
    server.push_all(steps);
    Ok(server)
}

/// A stream's `failure` is a transport error, after one request to `server` (no retry).
fn failed_in_transport_without_retry(
    kind: Kind,
    failure: Option<ModelError>,
    server: &ScriptedServer,
) -> TestResult {
    let err = failure.ok_or("stream did not fail")?;
    assert!(
        matches!(err, ModelError::Transport { .. }),
        "{kind:?}: {err:?}"
    );
    assert_eq!(server.request_count(), 1, "{kind:?}");
    Ok(())
}

/// The events of one streamed call of `m` up to its first error, and that error.
async fn until_error(
    m: &dyn hame_core::Model,
) -> Result<(Vec<hame_core::ModelEvent>, Option<ModelError>), ModelError> {
    let mut stream = m.stream(request("x")).await?;
    let mut seen = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => seen.push(ev),
            Err(e) => return Ok((seen, Some(e))),
        }
    }
    Ok((seen, None))
}

#[tokio::test]
async fn retry_on_429_honours_retry_after() -> TestResult {
    for kind in BOTH {
        let server = answering([
            ScriptStep::rate_limited(0),
            ScriptStep::rate_limited(0),
            ScriptStep::text("finally"),
        ])
        .await?;
        // A base delay of an hour: only the honoured `Retry-After: 0` lets this finish.
        let retry = RetryConfig {
            initial_delay: Duration::from_secs(3600),
            max_delay: Duration::from_secs(3600),
            jitter: false,
            ..fast_retry(4)
        };
        let model = model(kind, &server, retry, Duration::from_secs(30))?;
        let r = model.complete(request("x")).await?;
        assert_eq!(r.message.text_content(), "finally", "{kind:?}");
        assert_eq!(server.request_count(), 3, "{kind:?}");
    }
    Ok(())
}

#[tokio::test]
async fn retry_after_longer_than_the_limit_is_returned_at_once() -> TestResult {
    for kind in BOTH {
        let server = answering([ScriptStep::rate_limited(120), ScriptStep::text("never")]).await?;
        let model = default_model(kind, &server)?;
        let err = model.complete(request("x")).await.err().ok_or("no error")?;
        assert!(
            matches!(err, ModelError::RateLimited { retry_after: Some(d), .. } if d == Duration::from_secs(120)),
            "{kind:?}: {err:?}"
        );
        assert_eq!(server.request_count(), 1, "{kind:?}");
    }
    Ok(())
}

#[tokio::test]
async fn retry_on_5xx_then_give_up() -> TestResult {
    for kind in BOTH {
        let server = answering([
            ScriptStep::error(500, "boom"),
            ScriptStep::error(503, "busy"),
            ScriptStep::text("ok"),
        ])
        .await?;
        let model = default_model(kind, &server)?;
        let events = stream_events(model.as_ref(), request("x")).await?;
        assert_eq!(assemble(&events).message.text_content(), "ok");
        assert_eq!(server.request_count(), 3, "{kind:?}");

        // Exhausted: 1 attempt + 3 retries, then the last error.
        for _ in 0..4 {
            server.push(ScriptStep::error(502, "bad gateway"));
        }
        server.push(ScriptStep::text("unreached"));
        let err = model.complete(request("x")).await.err().ok_or("no error")?;
        assert!(
            matches!(err, ModelError::Provider { status: 502, .. }),
            "{kind:?}: {err:?}"
        );
        assert_eq!(server.request_count(), 3 + 4, "{kind:?}");
    }
    Ok(())
}

#[tokio::test]
async fn no_retry_on_401_and_the_message_names_the_key() -> TestResult {
    for (kind, var) in [
        (Kind::OpenAi, "OPENAI_API_KEY"),
        (Kind::Anthropic, "ANTHROPIC_API_KEY"),
    ] {
        let server = answering([ScriptStep::unauthorized(), ScriptStep::text("unreached")]).await?;
        let model = default_model(kind, &server)?;
        let err = model.stream(request("x")).await.err().ok_or("no error")?;
        let ModelError::Auth { status, message } = &err else {
            return Err(format!("{kind:?}: not auth: {err:?}").into());
        };
        assert_eq!(*status, 401);
        let base = if kind == Kind::OpenAi {
            server.base_url()
        } else {
            server.url()
        };
        assert!(
            message.starts_with(&format!("{var} was rejected by {base} (401)")),
            "{message}"
        );
        assert!(message.contains("Incorrect API key provided"), "{message}");
        assert_eq!(server.request_count(), 1, "{kind:?}");
    }
    Ok(())
}

#[tokio::test]
async fn context_overflow_bodies_of_every_provider() -> TestResult {
    for kind in BOTH {
        for step in [
            ScriptStep::openai_context_overflow(),
            ScriptStep::anthropic_context_overflow(),
            ScriptStep::dashscope_context_overflow(),
            ScriptStep::dashscope_native_context_overflow(),
        ] {
            let server = answering([step.clone()]).await?;
            let model = default_model(kind, &server)?;
            let err = model.complete(request("x")).await.err().ok_or("no error")?;
            assert!(err.is_context_overflow(), "{kind:?} {step:?}: {err:?}");
            assert!(!err.is_retryable());
            assert_eq!(server.request_count(), 1);
        }
    }
    Ok(())
}

#[tokio::test]
async fn slow_headers_time_out_as_transport_and_are_retried() -> TestResult {
    for kind in BOTH {
        let server =
            answering([ScriptStep::text("too late").with_delay(Duration::from_secs(5))]).await?;
        let m = model(
            kind,
            &server,
            RetryConfig::none(),
            Duration::from_millis(300),
        )?;
        let err = m.complete(request("x")).await.err().ok_or("no error")?;
        assert!(
            matches!(err, ModelError::Transport { .. }),
            "{kind:?}: {err:?}"
        );
        assert!(err.is_retryable());
        assert_eq!(server.request_count(), 1);

        // With one retry the fast second answer wins.
        server.push(ScriptStep::text("too late").with_delay(Duration::from_secs(5)));
        server.push(ScriptStep::text("on time"));
        let m = model(kind, &server, fast_retry(1), Duration::from_millis(300))?;
        let events = stream_events(m.as_ref(), request("x")).await?;
        assert_eq!(assemble(&events).message.text_content(), "on time");
        assert_eq!(server.request_count(), 3);
    }
    Ok(())
}

#[tokio::test]
async fn stalled_stream_fails_without_retry() -> TestResult {
    for kind in BOTH {
        let server = answering([
            ScriptStep::text("slow chunks").with_chunk_delay(Duration::from_secs(5)),
            ScriptStep::text("a retry would get this"),
        ])
        .await?;
        let m = model(kind, &server, fast_retry(3), Duration::from_millis(300))?;
        let (_, got_error) = until_error(m.as_ref()).await?;
        failed_in_transport_without_retry(kind, got_error, &server)?;
    }
    Ok(())
}

#[tokio::test]
async fn connection_refused_is_transport() -> TestResult {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let openai = hame_model::OpenAiModel::new(hame_model::OpenAiConfig {
        base_url: format!("http://127.0.0.1:{port}/v1"),
        retry: RetryConfig::none(),
        ..hame_model::OpenAiConfig::new("m")
    })?;
    let anthropic = hame_model::AnthropicModel::new(hame_model::AnthropicConfig {
        base_url: format!("http://127.0.0.1:{port}"),
        retry: RetryConfig::none(),
        ..hame_model::AnthropicConfig::new("claude-x")
    })?;
    for m in [&openai as &dyn hame_core::Model, &anthropic] {
        let err = m.complete(request("x")).await.err().ok_or("no error")?;
        assert!(matches!(err, ModelError::Transport { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&format!("127.0.0.1:{port}")),
            "{err}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn responder_drives_a_long_session() -> TestResult {
    for kind in BOTH {
        let server = ScriptedServer::start().await?;
        server.set_responder(|req: &hame_test_support::RecordedRequest| {
            ScriptStep::text(format!(
                "echo: {}",
                req.last_user_text().unwrap_or_default()
            ))
        });
        let model = default_model(kind, &server)?;
        for turn in 0..60 {
            let r = model.complete(request(&format!("turn {turn}"))).await?;
            assert_eq!(r.message.text_content(), format!("echo: turn {turn}"));
        }
        let events = stream_events(model.as_ref(), request("last")).await?;
        assert_eq!(assemble(&events).message.text_content(), "echo: last");
        assert_eq!(server.request_count(), 61);
    }
    Ok(())
}

#[tokio::test]
async fn broken_streams_fail_after_events_without_retry() -> TestResult {
    for kind in BOTH {
        // Closed part-way: the events so far arrive, then a transport error.
        let server = answering([
            ScriptStep::text("a fairly long answer").cut_after(4),
            ScriptStep::text("a retry would get this"),
        ])
        .await?;
        let m = default_model(kind, &server)?;
        let (seen, failure) = until_error(m.as_ref()).await?;
        assert!(!seen.is_empty(), "{kind:?}: events before the cut");
        failed_in_transport_without_retry(kind, failure, &server)?;
    }
    Ok(())
}

#[tokio::test]
async fn in_stream_errors_are_classified() -> TestResult {
    let server = answering([
        ScriptStep::text("partial answer").error_after(
            2,
            serde_json::json!({"error": {"code": "context_length_exceeded", "message": "too long"}}),
        ),
        ScriptStep::text("partial answer").error_after(
            3,
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
    ])
    .await?;
    let openai = default_model(Kind::OpenAi, &server)?;
    let err = stream_events(openai.as_ref(), request("x"))
        .await
        .err()
        .ok_or("no error")?;
    assert!(err.is_context_overflow(), "{err:?}");
    let anthropic = default_model(Kind::Anthropic, &server)?;
    let err = stream_events(anthropic.as_ref(), request("x"))
        .await
        .err()
        .ok_or("no error")?;
    assert!(
        matches!(err, ModelError::Provider { status: 529, .. }),
        "{err:?}"
    );
    assert_eq!(server.request_count(), 2);
    Ok(())
}

/// A provider that echoes the key it refused (or any error body that repeats it) does not
/// put the key into the error: the client registered it (`hame_core::secrets`) and the body
/// is redacted as soon as it is read. The operator still sees the URL.
#[tokio::test]
async fn a_key_echoed_by_the_provider_is_redacted() -> TestResult {
    for kind in BOTH {
        let key = format!("sk-echoed-{kind:?}-7f6e5d4c3b2a");
        let server = answering([
            ScriptStep::unauthorized_echoing_key(),
            ScriptStep::error(400, "bad request from key {api_key}"),
            ScriptStep::text("partial").error_after(
                3,
                serde_json::json!({"type": "error", "error": {"type": "api_error", "message": "stream refused {api_key}"}}),
            ),
        ])
        .await?;
        let model: Arc<dyn hame_core::Model> = match kind {
            Kind::OpenAi => Arc::new(hame_model::OpenAiModel::new(hame_model::OpenAiConfig {
                api_key: Some(key.clone()),
                ..openai_config(&server)
            })?),
            Kind::Anthropic => Arc::new(hame_model::AnthropicModel::new(
                hame_model::AnthropicConfig {
                    api_key: Some(key.clone()),
                    ..anthropic_config(&server)
                },
            )?),
        };
        let auth = model.complete(request("x")).await.err().ok_or("no error")?;
        let bad = model.complete(request("x")).await.err().ok_or("no error")?;
        let (_, in_stream) = until_error(model.as_ref()).await?;
        let in_stream = in_stream.ok_or("no stream error")?;
        assert!(matches!(auth, ModelError::Auth { .. }), "{auth:?}");
        for e in [&auth, &bad, &in_stream] {
            let text = format!("{e} {e:?}");
            assert!(!text.contains(&key), "{kind:?}: {text}");
            assert!(
                text.contains(hame_core::secrets::REDACTED),
                "{kind:?}: {text}"
            );
        }
        assert!(
            auth.to_string().contains(&server.addr().to_string()),
            "{auth}"
        );
    }
    Ok(())
}
