//! Two users of one agent: separate files, separate personas, separate logs.

use std::fs;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{Scratch, run_ok, run_with, stderr, system_of, tool_results};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One step of tool calls `b1`, `b2`, ... with these tools and arguments.
fn probes(calls: &[(&str, serde_json::Value)]) -> ScriptStep {
    ScriptStep::tool_calls(
        calls
            .iter()
            .enumerate()
            .map(|(i, (tool, args))| {
                hame_test_support::ScriptToolCall::new(format!("b{}", i + 1), *tool, args)
            })
            .collect(),
    )
}

/// Alice's turn: she writes her secret to `path`.
fn alice_writes(path: &str) -> [ScriptStep; 2] {
    [
        ScriptStep::tool_call(
            "a1",
            "write_file",
            json!({"file_path": path, "content": "alice-secret-42"}),
        ),
        ScriptStep::text("saved"),
    ]
}

/// Bob's attempts on alice's files: every file tool, several spellings of each path.
fn bob_probes() -> ScriptStep {
    probes(&[
        ("read_file", json!({"file_path": "secret.md"})),
        ("read_file", json!({"file_path": "alice/secret.md"})),
        ("read_file", json!({"file_path": "/alice/./secret.md"})),
        ("read_file", json!({"file_path": "alice/AGENTS.md"})),
        (
            "read_file",
            json!({"file_path": "agents/hame/users/alice/home/secret.md"}),
        ),
        ("grep_files", json!({"pattern": "alice-secret"})),
        ("grep_files", json!({"pattern": "alice", "path": "alice"})),
        ("glob_files", json!({"pattern": "**/*.md"})),
        ("list_files", json!({"path": "/"})),
        ("list_files", json!({"path": "alice"})),
        (
            "edit_file",
            json!({"file_path": "alice/AGENTS.md", "old_string": "persona", "new_string": "hacked"}),
        ),
        (
            "write_file",
            json!({"file_path": "alice/AGENTS.md", "content": "hacked"}),
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

    server.push_all(alice_writes(path));
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
    let sc = Scratch::scripted([ScriptStep::text("a"), ScriptStep::text("b")]).await?;
    sc.write("AGENTS.md", "shared persona")?;
    sc.write("alice/AGENTS.md", "alice's persona")?;
    for user in ["alice", "bob"] {
        sc.run(&sc.ws_args(&["--user", user]), "hi", &[]).await?;
    }
    let reqs = sc.server.requests();
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

/// Issue #30, item 3: a folder is a user's because its name is a user id hame served, not
/// because of what it holds. Alice's template folder without any marker is hidden from bob
/// once alice has called; a project folder that holds `skills/` and `AGENTS.md` is not.
#[tokio::test]
async fn user_folders_are_the_users_hame_served_not_folders_with_markers() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("alice"))?;
    fs::create_dir_all(ws.join("proj/skills/lint"))?;
    fs::write(ws.join("alice/persona.txt"), "alice-secret-3")?;
    fs::write(ws.join("proj/AGENTS.md"), "project readme shared-5")?;
    fs::write(ws.join("proj/skills/lint/SKILL.md"), "lint skill shared-6")?;
    let ws_s = ws.to_string_lossy().into_owned();
    let base = server.base_url();
    server.push_all([ScriptStep::text("hi alice")]);
    let alice = [
        "--workspace",
        ws_s.as_str(),
        "--isolated",
        "--user",
        "alice",
    ];
    run_ok(dir.path(), &base, &alice, "hello").await?;
    server.push_all([
        probes(&[
            ("read_file", json!({"file_path": "alice/persona.txt"})),
            ("grep_files", json!({"pattern": "secret|shared"})),
            ("list_files", json!({"path": "/"})),
        ]),
        ScriptStep::text("done"),
    ]);
    let bob = ["--workspace", ws_s.as_str(), "--isolated", "--user", "bob"];
    run_ok(dir.path(), &base, &bob, "look").await?;
    let results = tool_results(&server);
    assert!(
        results.iter().all(|r| !r.contains("alice-secret")),
        "{results:#?}"
    );
    assert!(!results[2].contains("alice"), "{}", results[2]);
    assert!(
        results[1].contains("shared-5") && results[1].contains("shared-6"),
        "{}",
        results[1]
    );
    assert!(results[2].contains("proj/"), "{}", results[2]);
    Ok(())
}

/// Issue #30, item 4: bob's own link to alice's folder (and one out of the workspace) leads
/// his file tools nowhere: walks do not follow it, a path through it does not exist.
#[tokio::test]
async fn a_users_symlink_does_not_lead_into_another_users_folder() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    fs::write(dir.path().join("outside.txt"), "outside-secret-9")?;
    let ws_s = ws.to_string_lossy().into_owned();
    let base = server.base_url();
    server.push_all(alice_writes("alice/secret.md"));
    let alice = ["--workspace", ws_s.as_str(), "--user", "alice"];
    run_ok(dir.path(), &base, &alice, "save").await?;
    fs::create_dir_all(ws.join("bob"))?;
    std::os::unix::fs::symlink("../alice", ws.join("bob/x"))?;
    std::os::unix::fs::symlink("../alice/secret.md", ws.join("bob/y"))?;
    std::os::unix::fs::symlink(dir.path().join("outside.txt"), ws.join("bob/out"))?;
    server.push_all([
        probes(&[
            ("grep_files", json!({"pattern": "secret"})),
            ("grep_files", json!({"pattern": "secret", "path": "bob"})),
            ("glob_files", json!({"pattern": "**"})),
            ("list_files", json!({"path": "bob/x"})),
            ("read_file", json!({"file_path": "bob/x/secret.md"})),
            ("read_file", json!({"file_path": "bob/y"})),
            ("read_file", json!({"file_path": "bob/out"})),
            (
                "grep_files",
                json!({"pattern": "alice", "path": "bob/x/agents"}),
            ),
        ]),
        ScriptStep::text("done"),
    ]);
    let bob = ["--workspace", ws_s.as_str(), "--user", "bob"];
    run_ok(dir.path(), &base, &bob, "look").await?;
    let results = tool_results(&server);
    assert_eq!(results.len(), 8);
    for r in &results {
        assert!(
            !r.contains("secret-") && !r.contains("alice/") && !r.contains("session"),
            "bob reached alice's files: {results:#?}"
        );
    }
    Ok(())
}
