//! Two users of one agent: separate files, separate personas, separate logs.

use std::fs;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{last_tool_result, run_with, stderr, system_of};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn users_cannot_see_each_other() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_s = ws.to_string_lossy().into_owned();
    let base = server.base_url();

    server.push_all([
        ScriptStep::tool_call(
            "a1",
            "write_file",
            json!({"file_path": "secret.md", "content": "alice-secret-42"}),
        ),
        ScriptStep::text("saved"),
    ]);
    let out = run_with(
        dir.path(),
        &base,
        &["--workspace", &ws_s, "--user", "alice"],
        "save",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    server.push_all([
        ScriptStep::tool_calls(vec![
            hame_test_support::ScriptToolCall::new(
                "b1",
                "read_file",
                &json!({"file_path": "secret.md"}),
            ),
            hame_test_support::ScriptToolCall::new(
                "b2",
                "read_file",
                &json!({"file_path": "agents/hame/users/alice/home/secret.md"}),
            ),
            hame_test_support::ScriptToolCall::new(
                "b3",
                "grep_files",
                &json!({"pattern": "alice-secret"}),
            ),
            hame_test_support::ScriptToolCall::new(
                "b4",
                "glob_files",
                &json!({"pattern": "**/*.md"}),
            ),
        ]),
        ScriptStep::text("nothing"),
    ]);
    let out = run_with(
        dir.path(),
        &base,
        &["--workspace", &ws_s, "--user", "bob"],
        "look",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reqs = server.requests();
    let body = &reqs[reqs.len() - 1].body;
    let text = serde_json::to_string(&body["messages"])?;
    assert!(
        !text.contains("alice-secret-42"),
        "bob saw alice's file: {text}"
    );
    assert!(last_tool_result(body).len() < 10_000);
    Ok(())
}

#[tokio::test]
async fn per_user_agents_md_overrides_the_shared_one() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([ScriptStep::text("a"), ScriptStep::text("b")]);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("alice"))?;
    fs::write(ws.join("AGENTS.md"), "shared persona")?;
    fs::write(ws.join("alice/AGENTS.md"), "alice's persona")?;
    let ws_s = ws.to_string_lossy().into_owned();
    let base = server.base_url();
    run_with(
        dir.path(),
        &base,
        &["--workspace", &ws_s, "--user", "alice"],
        "hi",
        &[],
    )
    .await?;
    run_with(
        dir.path(),
        &base,
        &["--workspace", &ws_s, "--user", "bob"],
        "hi",
        &[],
    )
    .await?;
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let alice = system_of(&reqs[0].body);
    let bob = system_of(&reqs[1].body);
    assert!(
        alice.contains("alice's persona") && !alice.contains("shared persona"),
        "{alice}"
    );
    assert!(
        bob.contains("shared persona") && !bob.contains("alice's persona"),
        "{bob}"
    );
    Ok(())
}
