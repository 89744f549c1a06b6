//! Sessions resume across processes.

use std::fs;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{run_with, stderr};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn user_texts(body: &serde_json::Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "user" || m["role"] == "assistant")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_session_continues_in_a_new_process() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::text("Nice to meet you, Ada."),
        ScriptStep::text("You are Ada."),
    ]);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_s = ws.to_string_lossy().into_owned();
    let base = server.base_url();
    let args = [
        "--workspace",
        ws_s.as_str(),
        "--user",
        "ada",
        "--session",
        "intro",
    ];
    let first = run_with(dir.path(), &base, &args, "My name is Ada.", &[]).await?;
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let second = run_with(dir.path(), &base, &args, "Who am I?", &[]).await?;
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let reqs = server.requests();
    assert_eq!(
        user_texts(&reqs[1].body),
        vec!["My name is Ada.", "Nice to meet you, Ada.", "Who am I?"]
    );
    // Another session of the same user starts empty.
    server.push(ScriptStep::text("Hello."));
    let other = [
        "--workspace",
        ws_s.as_str(),
        "--user",
        "ada",
        "--session",
        "other",
    ];
    run_with(dir.path(), &base, &other, "Hi", &[]).await?;
    assert_eq!(user_texts(&server.requests()[2].body), vec!["Hi"]);
    // The state is a JSON document under HAME_STATE_HOME/<workspace identity>/<agent>.
    assert!(
        super::common::state_dir(dir.path(), &ws)
            .join("hame")
            .is_dir()
    );
    Ok(())
}
