//! Replicas: a session started by one process continues in another process with its own
//! workspace directory, on every state backend (`--state`).

use std::fs;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{run_with, service, stderr, unique_agent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The user and assistant texts of a recorded OpenAI-style request.
pub(super) fn dialogue(body: &serde_json::Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "user" || m["role"] == "assistant")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A replica: its own directory and workspace, nothing on disk shared with the other.
fn replica() -> std::io::Result<(tempfile::TempDir, String)> {
    let dir = tempfile::tempdir()?;
    fs::create_dir_all(dir.path().join("ws"))?;
    fs::write(dir.path().join("ws/AGENTS.md"), "You are a replica.\n")?;
    let ws = dir.path().join("ws").to_string_lossy().into_owned();
    Ok((dir, ws))
}

/// Process A answers turn one, process B (another workspace directory) continues the
/// session: B's first model request carries A's exchange.
async fn continue_in_second_replica(state: &str) -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::text("Hello Ada, noted."),
        ScriptStep::text("You are Ada."),
    ]);
    let base = server.base_url();
    let agent = unique_agent();
    let args = |ws: &str| -> Vec<String> {
        [
            "--workspace",
            ws,
            "--agent",
            &agent,
            "--user",
            "ada",
            "--session",
            "handover",
            "--state",
            state,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let (a, ws_a) = replica()?;
    let (b, ws_b) = replica()?;

    let args_a = args(&ws_a);
    let args_a: Vec<&str> = args_a.iter().map(String::as_str).collect();
    let out = run_with(a.path(), &base, &args_a, "My name is Ada.", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let args_b = args(&ws_b);
    let args_b: Vec<&str> = args_b.iter().map(String::as_str).collect();
    let out = run_with(b.path(), &base, &args_b, "Who am I?", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "You are Ada.\n");

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(dialogue(&reqs[0].body), vec!["My name is Ada."]);
    assert_eq!(
        dialogue(&reqs[1].body),
        vec!["My name is Ada.", "Hello Ada, noted.", "Who am I?"]
    );
    // Each replica logged the messages of its own call in its own workspace; the
    // conversation itself travelled through the state store only.
    let log = format!("ws/ada/agents/{agent}/sessions/handover.log.jsonl");
    assert!(a.path().join(&log).is_file());
    assert!(b.path().join(&log).is_file());
    Ok(())
}

#[tokio::test]
async fn replicas_continue_a_session_through_a_json_state_dir() -> TestResult {
    let shared = tempfile::tempdir()?;
    continue_in_second_replica(&shared.path().to_string_lossy()).await
}

#[tokio::test]
async fn replicas_continue_a_session_through_redis() -> TestResult {
    let Some(url) = service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    continue_in_second_replica(&url).await
}

#[tokio::test]
async fn replicas_continue_a_session_through_postgres() -> TestResult {
    let Some(url) = service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    continue_in_second_replica(&url).await
}

#[tokio::test]
async fn replicas_continue_a_session_through_mysql() -> TestResult {
    let Some(url) = service("HAME_TEST_MYSQL_URL") else {
        return Ok(());
    };
    continue_in_second_replica(&url).await
}
