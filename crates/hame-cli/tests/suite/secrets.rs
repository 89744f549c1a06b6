//! Configured secrets never reach a file, a model request or an API caller, even when a
//! provider's error echoes them (issue #30, item 2): the scripted server answers 401 with
//! a body that repeats the key (or the whole `Authorization` header) it received.

use std::path::{Path, PathBuf};

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{files_containing, run_with, stderr, stdout};
use super::serve::{Serve, client, parse_sse, texts, ws_log};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The API key of these tests: long and unique, so any copy of it is found.
const KEY: &str = "sk-hame-test-4f9c2d7e1b8a6035c9d1";

/// A new directory with a workspace `ws`, a scripted model that first answers 401 echoing
/// the key it got, and the `--workspace`/`--session s1` arguments of `hame run`.
async fn refused_key_setup()
-> Result<(tempfile::TempDir, ScriptedServer, [String; 4]), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    let model = ScriptedServer::start().await?;
    model.push(ScriptStep::unauthorized_echoing_key());
    let args = [
        "--workspace".to_owned(),
        ws.to_string_lossy().into_owned(),
        "--session".to_owned(),
        "s1".to_owned(),
    ];
    Ok((dir, model, args))
}

/// The texts of the session log `s` of workspace `dir/ws`, joined.
fn log_text(dir: &Path, session: &str) -> String {
    texts(&ws_log(dir, None, session)).join("\n")
}

#[tokio::test]
async fn run_keeps_an_echoed_key_out_of_output_files_and_the_next_request() -> TestResult {
    let (dir, model, args) = refused_key_setup().await?;
    model.push(ScriptStep::text("fine now"));
    let args = args.each_ref().map(String::as_str);
    let env = [("OPENAI_API_KEY", KEY)];
    let out = run_with(dir.path(), &model.base_url(), &args, "hi", &env).await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let (o, e) = (stdout(&out), stderr(&out));
    // The provider's message is still there, with the key cut out.
    assert!(e.contains("Incorrect API key provided: [REDACTED]"), "{e}");
    assert!(!o.contains(KEY) && !e.contains(KEY), "{o}\n{e}");
    // The failed turn is recorded (redacted) and the next request carries that note.
    let log = log_text(dir.path(), "s1");
    assert!(log.contains("[This request did not finish: "), "{log}");
    assert!(log.contains("[REDACTED]"), "{log}");
    let out = run_with(dir.path(), &model.base_url(), &args, "again", &env).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "fine now");
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    let next = reqs[1].body.to_string();
    assert!(next.contains("did not finish"), "{next}");
    assert!(!next.contains(KEY), "{next}");
    assert_eq!(
        files_containing(dir.path(), KEY),
        Vec::<PathBuf>::new(),
        "the key is on disk"
    );
    Ok(())
}

#[tokio::test]
async fn run_keeps_base_url_credentials_and_their_basic_auth_form_out() -> TestResult {
    let (dir, model, args) = refused_key_setup().await?;
    let args = args.each_ref().map(String::as_str);
    let password = "pw-7d3e9a1c5b2f";
    // What `Authorization: Basic …` carries for `hame:<password>`.
    let basic = "aGFtZTpwdy03ZDNlOWExYzViMmY=";
    let base = model
        .base_url()
        .replacen("http://", &format!("http://hame:{password}@"), 1);
    let out = run_with(dir.path(), &base, &args, "hi", &[]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let reqs = model.requests();
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Basic {basic}").as_str()),
        "the URL's credentials are sent as basic auth"
    );
    let e = stderr(&out);
    assert!(e.contains("Authorization: Basic [REDACTED]"), "{e}");
    for secret in [password, basic] {
        assert!(!e.contains(secret) && !stdout(&out).contains(secret), "{e}");
        assert_eq!(files_containing(dir.path(), secret), Vec::<PathBuf>::new());
    }
    assert!(log_text(dir.path(), "s1").contains("did not finish"));
    Ok(())
}

#[tokio::test]
async fn serve_shows_callers_neither_the_key_nor_the_providers_url() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.set_responder(|_: &hame_test_support::RecordedRequest| {
        ScriptStep::unauthorized_echoing_key()
    });
    let provider = model.addr().to_string();
    let serve = Serve::start_env(
        dir.path(),
        &model.base_url(),
        &[],
        &[("OPENAI_API_KEY", KEY)],
    )?;
    let c = client();
    let hidden = |what: &str, text: &str| {
        assert!(!text.contains(KEY), "{what} shows the key: {text}");
        assert!(
            !text.contains(&provider),
            "{what} names the provider: {text}"
        );
    };
    // JSON: 502 with the provider's message, redacted.
    let r = c
        .post(serve.at("/v1/sessions/s1/messages"))
        .json(&json!({"message": "hi"}))
        .send()
        .await?;
    assert_eq!(r.status(), 502);
    let body = r.text().await?;
    hidden("the 502 body", &body);
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["error"]["code"], "call_failed");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Incorrect API key provided: [REDACTED]")),
        "{body}"
    );
    // SSE: the `failed` event.
    let r = c
        .post(serve.at("/v1/sessions/s1/messages"))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "again"}))
        .send()
        .await?;
    let text = r.text().await?;
    let failed: Vec<_> = parse_sse(&text)
        .into_iter()
        .filter(|e| e.event == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{text}");
    hidden("the SSE stream", &text);
    // Replayed events.
    let r = c
        .get(serve.at("/v1/sessions/s1/events?after=0"))
        .send()
        .await?;
    hidden("the replayed events", &r.text().await?);
    // The session's log over HTTP.
    let r = c.get(serve.at("/v1/sessions/s1/messages")).send().await?;
    assert_eq!(r.status(), 200);
    let body = r.text().await?;
    assert!(body.contains("did not finish"), "{body}");
    hidden("GET messages", &body);
    // The OpenAI-compatible route.
    let r = c
        .post(serve.at("/v1/chat/completions"))
        .json(&json!({"model": "hame", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    assert_eq!(r.status(), 502);
    hidden("the chat completions error", &r.text().await?);
    let r = c
        .post(serve.at("/v1/chat/completions"))
        .json(&json!({"model": "hame", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    hidden("the chat completions stream", &r.text().await?);
    // Nothing the model was sent, nothing on disk, nothing in the operator's log.
    for req in model.requests().iter().skip(1) {
        assert!(!req.body.to_string().contains(KEY), "{}", req.body);
    }
    assert_eq!(files_containing(dir.path(), KEY), Vec::<PathBuf>::new());
    assert!(!serve.stderr().contains(KEY), "{}", serve.stderr());
    Ok(())
}
