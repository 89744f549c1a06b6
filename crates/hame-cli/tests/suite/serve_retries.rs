//! A retried request does not run its turn twice (issue #30, item 12): errors a retry
//! cannot fix say `x-should-retry: false`, and a retry of a request (the official OpenAI
//! SDK's `x-stainless-retry-count`, or any client's `Idempotency-Key`) gets the first
//! attempt's answer instead of a second turn.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::serve::{Serve, client, openai_python, parse_sse, texts, ws_log};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs `script` with the SDK's Python against `base`; its stdout as JSON.
async fn python(
    py: PathBuf,
    dir: &Path,
    script: &str,
    base: String,
) -> Result<Value, Box<dyn std::error::Error>> {
    let path = dir.join("client.py");
    std::fs::write(&path, script)?;
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py).arg(path).arg(base).output()
    })
    .await??;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

const FAILING_TURN_PY: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=2)
try:
    client.chat.completions.create(model="hame", messages=[{"role": "user", "content": "hi"}])
    print(json.dumps({"error": None}))
except openai.APIStatusError as e:
    print(json.dumps({"error": type(e).__name__, "status": e.status_code,
                      "should_retry": e.response.headers.get("x-should-retry")}))
"#;

#[tokio::test]
async fn the_openai_sdk_does_not_run_a_failed_turn_again() -> TestResult {
    let Some(py) = openai_python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.set_responder(|_: &RecordedRequest| ScriptStep::unauthorized());
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let got = python(py, dir.path(), FAILING_TURN_PY, serve.at("/v1")).await?;
    assert_eq!(
        got,
        json!({"error": "InternalServerError", "status": 502, "should_retry": "false"})
    );
    assert_eq!(model.request_count(), 1, "the turn ran more than once");
    Ok(())
}

const SLOW_TURN_PY: &str = r#"
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=3, timeout=1.0,
                       default_headers={"X-Hame-Session": "slow"})
r = client.chat.completions.create(model="hame", messages=[{"role": "user", "content": "take your time"}])
print(json.dumps({"text": r.choices[0].message.content}))
"#;

#[tokio::test]
async fn a_retry_of_a_slow_turn_waits_for_it_instead_of_starting_another() -> TestResult {
    let Some(py) = openai_python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    // Longer than the SDK's timeout: the SDK gives up on the first attempt and retries.
    model.set_responder(|_: &RecordedRequest| {
        ScriptStep::text("slow reply").with_delay(Duration::from_millis(1600))
    });
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let got = python(py, dir.path(), SLOW_TURN_PY, serve.at("/v1")).await?;
    assert_eq!(got, json!({"text": "slow reply"}));
    assert_eq!(model.request_count(), 1, "the turn ran more than once");
    assert_eq!(
        texts(&ws_log(dir.path(), None, "slow")),
        vec!["user: take your time", "assistant: slow reply"]
    );
    Ok(())
}

#[tokio::test]
async fn an_idempotency_key_answers_a_repeated_request_from_its_first_turn() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push_all([
        ScriptStep::text("first"),
        ScriptStep::text("second"),
        ScriptStep::unauthorized(),
    ]);
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let c = client();
    let url = serve.at("/v1/sessions/s1/messages");
    let send = |key: &'static str, message: &'static str| {
        c.post(&url)
            .header("idempotency-key", key)
            .json(&json!({ "message": message }))
            .send()
    };
    let a = send("k-1", "hello").await?;
    assert_eq!(a.status(), 200);
    let a: Value = a.json().await?;
    let again = send("k-1", "hello").await?;
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await?;
    assert_eq!(again, a);
    assert_eq!(a["reply"], "first");
    // Asked again as SSE: the event that ended the first turn, with its id.
    let sse = c
        .post(&url)
        .header("idempotency-key", "k-1")
        .header("accept", "text/event-stream")
        .json(&json!({ "message": "hello" }))
        .send()
        .await?
        .text()
        .await?;
    let events = parse_sse(&sse);
    assert_eq!(
        events.iter().map(|e| e.event.as_str()).collect::<Vec<_>>(),
        vec!["finished"],
        "{sse}"
    );
    assert_eq!(events[0].data, a);
    // The same key for another request is refused, not answered with the wrong reply.
    let other = send("k-1", "something else").await?;
    assert_eq!(other.status(), 409);
    assert_eq!(
        other.headers().get("x-should-retry").map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
    let body: Value = other.json().await?;
    assert_eq!(body["error"]["code"], "idempotency_key_reused");
    // Another key is another turn.
    let b: Value = send("k-2", "hello").await?.json().await?;
    assert_eq!(b["reply"], "second");
    // A failed turn: 502 with `x-should-retry: false`; its retry gets the same answer.
    let failed = send("k-3", "fail").await?;
    assert_eq!(failed.status(), 502);
    assert_eq!(
        failed.headers().get("x-should-retry").map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
    let failed: Value = failed.json().await?;
    let retried = send("k-3", "fail").await?;
    assert_eq!(retried.status(), 502);
    assert_eq!(retried.json::<Value>().await?, failed);
    assert_eq!(model.request_count(), 3);
    let log = texts(&ws_log(dir.path(), None, "s1"));
    assert_eq!(
        log.iter().filter(|l| l.starts_with("user: ")).count(),
        3,
        "{log:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_repeated_streamed_chat_completion_gets_the_whole_reply_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push(ScriptStep::text("streamed once"));
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let body = json!({"model": "hame", "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let mut contents = Vec::new();
    for _ in 0..2 {
        let r = client()
            .post(serve.at("/v1/chat/completions"))
            .header("idempotency-key", "chat-1")
            .json(&body)
            .send()
            .await?;
        assert_eq!(r.status(), 200);
        let chunks = parse_sse(&r.text().await?);
        let content: String = chunks
            .iter()
            .filter_map(|c| c.data["choices"][0]["delta"]["content"].as_str())
            .collect();
        contents.push(content);
    }
    assert_eq!(contents, vec!["streamed once", "streamed once"]);
    assert_eq!(model.request_count(), 1);
    Ok(())
}
