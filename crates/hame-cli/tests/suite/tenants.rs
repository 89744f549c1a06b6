//! Two users of one agent: separate files, separate personas, separate logs.

use std::fs;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{run_with, stderr, system_of, tool_results};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Bob's attempts on alice's files: every file tool, several spellings of each path.
fn bob_probes() -> ScriptStep {
    let call = hame_test_support::ScriptToolCall::new;
    ScriptStep::tool_calls(vec![
        call("b1", "read_file", &json!({"file_path": "secret.md"})),
        call("b2", "read_file", &json!({"file_path": "alice/secret.md"})),
        call(
            "b3",
            "read_file",
            &json!({"file_path": "/alice/./secret.md"}),
        ),
        call("b4", "read_file", &json!({"file_path": "alice/AGENTS.md"})),
        call(
            "b5",
            "read_file",
            &json!({"file_path": "agents/hame/users/alice/home/secret.md"}),
        ),
        call("b6", "grep_files", &json!({"pattern": "alice-secret"})),
        call(
            "b7",
            "grep_files",
            &json!({"pattern": "alice", "path": "alice"}),
        ),
        call("b8", "glob_files", &json!({"pattern": "**/*.md"})),
        call("b9", "list_files", &json!({"path": "/"})),
        call("b10", "list_files", &json!({"path": "alice"})),
        call(
            "b11",
            "edit_file",
            &json!({"file_path": "alice/AGENTS.md", "old_string": "persona", "new_string": "hacked"}),
        ),
        call(
            "b12",
            "write_file",
            &json!({"file_path": "alice/AGENTS.md", "content": "hacked"}),
        ),
    ])
}

/// Alice writes `path`; bob then tries every file tool on alice's files. `mode` selects
/// the filesystem mode (`[]` local, `["--isolated"]`).
async fn users_cannot_see_each_other_in(mode: &[&str], path: &str) -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("alice"))?;
    fs::write(ws.join("alice/AGENTS.md"), "alice persona alice-secret-7")?;
    let ws_s = ws.to_string_lossy().into_owned();
    let base = server.base_url();

    server.push_all([
        ScriptStep::tool_call(
            "a1",
            "write_file",
            json!({"file_path": path, "content": "alice-secret-42"}),
        ),
        ScriptStep::text("saved"),
    ]);
    let mut args = vec!["--workspace", ws_s.as_str(), "--user", "alice"];
    args.extend_from_slice(mode);
    let out = run_with(dir.path(), &base, &args, "save", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    server.push_all([bob_probes(), ScriptStep::text("nothing")]);
    let mut args = vec!["--workspace", ws_s.as_str(), "--user", "bob"];
    args.extend_from_slice(mode);
    let out = run_with(dir.path(), &base, &args, "look", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = tool_results(&server);
    assert_eq!(results.len(), 12);
    for r in &results {
        assert!(
            !r.contains("alice-secret"),
            "bob saw alice's file: {results:#?}"
        );
    }
    // Not even the folder's name is listed.
    assert!(!results[8].contains("alice"), "{}", results[8]);
    // And alice's persona is untouched.
    assert_eq!(
        fs::read_to_string(ws.join("alice/AGENTS.md"))?,
        "alice persona alice-secret-7"
    );
    Ok(())
}

#[tokio::test]
async fn users_cannot_see_each_other() -> TestResult {
    // Local mode: alice's own folder is hers only.
    users_cannot_see_each_other_in(&[], "alice/secret.md").await
}

#[tokio::test]
async fn users_cannot_see_each_other_isolated() -> TestResult {
    users_cannot_see_each_other_in(&["--isolated"], "secret.md").await
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

#[tokio::test]
async fn users_cannot_see_each_other_in_a_shared_store() -> TestResult {
    let Some(redis) = super::common::service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    let agent = super::common::unique_agent();
    users_cannot_see_each_other_in(
        &["--store", &redis, "--state", &redis, "--agent", &agent],
        "secret.md",
    )
    .await
}
