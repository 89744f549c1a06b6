use std::time::Duration;

use hame_core::{ModelError, ModelEvent, StopReason, Usage};
use pretty_assertions::assert_eq;

use super::*;

fn failure(kind: FailureKind, error: ModelError) -> Failure {
    Failure { error, kind }
}

fn transport() -> ModelError {
    ModelError::Transport {
        message: "x".into(),
        source: None,
    }
}

const MS: fn(u64) -> Duration = Duration::from_millis;

#[test]
fn connect_failures_get_a_few_short_retries() {
    let retry = RetryConfig::default();
    let f = failure(FailureKind::Connect, transport());
    // The default backoff starts at 500 ms: connect retries are scaled to start at 100 ms.
    assert_eq!(next_wait(&f, Some(MS(500)), 0, &retry), Some(MS(100)));
    assert_eq!(next_wait(&f, Some(MS(1500)), 1, &retry), Some(MS(300)));
    assert_eq!(next_wait(&f, Some(MS(1000)), 2, &retry), None);
    // Never more than a second, whatever came before.
    assert_eq!(
        next_wait(&f, Some(Duration::from_secs(30)), 0, &retry),
        Some(Duration::from_secs(1))
    );
    // A fast policy is used as it is.
    let fast = RetryConfig {
        initial_delay: MS(1),
        ..RetryConfig::default()
    };
    assert_eq!(next_wait(&f, Some(MS(2)), 0, &fast), Some(MS(2)));
    // No retries configured: none.
    assert_eq!(next_wait(&f, None, 0, &retry), None);
    // A connect timeout already waited: no retry.
    let timeout = failure(FailureKind::ConnectTimeout, transport());
    assert_eq!(next_wait(&timeout, Some(MS(500)), 0, &retry), None);
}

#[test]
fn retry_after_replaces_the_backoff_up_to_the_cap() {
    let retry = RetryConfig::default();
    let limited = |secs| {
        failure(
            FailureKind::Other,
            ModelError::RateLimited {
                retry_after: Some(Duration::from_secs(secs)),
                message: String::new(),
            },
        )
    };
    assert_eq!(
        next_wait(&limited(7), Some(MS(500)), 0, &retry),
        Some(Duration::from_secs(7))
    );
    assert_eq!(
        next_wait(&limited(60), Some(MS(500)), 0, &retry),
        Some(Duration::from_secs(60))
    );
    assert_eq!(next_wait(&limited(61), Some(MS(500)), 0, &retry), None);
    assert_eq!(next_wait(&limited(100_000), Some(MS(500)), 0, &retry), None);
    assert_eq!(next_wait(&limited(1), None, 0, &retry), None);
    let other = failure(FailureKind::Other, transport());
    assert_eq!(next_wait(&other, Some(MS(800)), 5, &retry), Some(MS(800)));
}

#[test]
fn durations_read_like_text() {
    assert_eq!(human(MS(0)), "0 ms");
    assert_eq!(human(MS(250)), "250 ms");
    assert_eq!(human(MS(1000)), "1 s");
    assert_eq!(human(MS(1500)), "1.5 s");
    assert_eq!(human(Duration::from_secs(60)), "1 min");
    assert_eq!(human(Duration::from_secs(125)), "2 min 5 s");
    assert_eq!(human(Duration::from_secs(7200)), "2 h");
    assert_eq!(human(Duration::from_secs(100_000)), "27 h 46 min");
}

#[test]
fn a_reply_cut_off_before_any_content_is_an_error() {
    let stop = ModelEvent::Stop(StopReason::MaxTokens);
    let mut empty = OutputCheck::new(Some(64));
    for ev in [
        ModelEvent::TextDelta(" \n".into()),
        ModelEvent::ReasoningDelta("hmm".into()),
        ModelEvent::Usage(Usage {
            input_tokens: 10,
            output_tokens: 64,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
        }),
    ] {
        assert!(empty.see(&ev).is_ok());
    }
    match empty.see(&stop) {
        Err(ModelError::InvalidResponse(m)) => assert_eq!(
            m,
            "the model hit the output token limit (max_tokens 64, 64 output tokens used) before \
             writing any text or tool call (its reasoning used them all); raise max_tokens"
        ),
        other => panic!("{other:?}"),
    }
    let mut unknown = OutputCheck::new(None);
    let m = unknown.see(&stop).err().map(|e| e.to_string());
    assert_eq!(
        m.as_deref(),
        Some(
            "invalid response: the model hit the output token limit (the server's default) \
             before writing any text or tool call; raise max_tokens"
        )
    );
    // Cut off after some text, or with a tool call: a normal (partial) reply.
    for first in [
        ModelEvent::TextDelta("partial".into()),
        ModelEvent::ToolCallStart {
            index: 0,
            id: "c".into(),
            name: "t".into(),
        },
    ] {
        let mut c = OutputCheck::new(Some(64));
        assert!(c.see(&first).is_ok());
        assert!(c.see(&stop).is_ok());
    }
    // An empty reply that ended normally is not this check's business.
    assert!(
        OutputCheck::new(None)
            .see(&ModelEvent::Stop(StopReason::EndTurn))
            .is_ok()
    );
}

#[test]
fn retry_log_lines_are_brief() {
    assert_eq!(
        brief(&ModelError::Provider {
            status: 503,
            body: r#"{"error":{"message":"busy"}}"#.into()
        }),
        "HTTP 503: busy"
    );
    assert_eq!(
        brief(&ModelError::RateLimited {
            retry_after: Some(Duration::from_secs(2)),
            message: "slow down".into()
        }),
        "429 rate limited: slow down"
    );
}

#[test]
fn final_failures_are_never_retried() {
    let retry = RetryConfig::default();
    let f = failure(FailureKind::Final, transport());
    assert_eq!(next_wait(&f, Some(MS(500)), 0, &retry), None);
}

#[test]
fn loopback_hosts() {
    for (url, want) in [
        ("http://127.0.0.1:9/v1", true),
        ("http://127.1.2.3/v1", true),
        ("http://localhost:8080/v1", true),
        ("http://LOCALHOST./v1", true),
        ("http://[::1]:8080/v1", true),
        ("http://10.0.0.1/v1", false),
        ("https://api.openai.com/v1", false),
    ] {
        let u = Url::parse(url).map_err(|e| e.to_string());
        assert_eq!(u.map(|u| is_loopback(&u)), Ok(want), "{url}");
    }
}

#[test]
fn jitter_is_random_per_backoff() {
    use backon::BackoffBuilder;
    // Two schedules built the same way differ (a fixed seed would make every process
    // retry at the same instants).
    let schedule = || -> Vec<Duration> {
        backon::ExponentialBuilder::default()
            .with_min_delay(MS(500))
            .with_max_times(6)
            .with_jitter()
            .build()
            .collect()
    };
    let (a, b, c) = (schedule(), schedule(), schedule());
    assert_eq!(a.len(), 6);
    assert!(a != b || b != c, "{a:?} {b:?} {c:?}");
}
