//! Local mode as the reference defines it: the file tools and the shell work on the
//! workspace itself, runtime data at the reference layout, session logs out of the tools'
//! reach, state per workspace, secrets out of the shell's reach, private file modes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use hame_test_support::{ScriptStep, ScriptToolCall, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{run_with, stderr, stdout, tool_results};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn mode(p: &Path) -> std::io::Result<u32> {
    Ok(fs::metadata(p)?.permissions().mode() & 0o777)
}

#[tokio::test]
async fn file_tools_and_shell_share_the_workspace() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    fs::write(ws.join("mine.txt"), "colour: red\n")?;
    let ws_s = ws.to_string_lossy().into_owned();
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "out/a.txt", "content": "from-write-file\n"}),
        ),
        ScriptStep::tool_call(
            "c2",
            "execute",
            json!({"command": "cat out/a.txt && echo from-shell > sh.txt"}),
        ),
        ScriptStep::tool_call("c3", "read_file", json!({"file_path": "sh.txt"})),
        ScriptStep::tool_call("c4", "read_file", json!({"file_path": "mine.txt"})),
        ScriptStep::tool_call(
            "c5",
            "edit_file",
            json!({"file_path": "mine.txt", "old_string": "red", "new_string": "blue"}),
        ),
        ScriptStep::text("done"),
    ]);
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &ws_s],
        "go",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = tool_results(&server);
    assert!(results[1].contains("from-write-file"), "{}", results[1]);
    assert!(results[2].contains("from-shell"), "{}", results[2]);
    assert_eq!(
        fs::read_to_string(ws.join("out/a.txt"))?,
        "from-write-file\n"
    );
    assert_eq!(fs::read_to_string(ws.join("mine.txt"))?, "colour: blue\n");

    // The reference layout, no nested namespaces.
    let sessions = ws.join("agents/hame/sessions");
    assert!(sessions.join("default.log.jsonl").is_file());
    assert!(sessions.join("index/default.json").is_file());
    assert!(!sessions.join("sessions.json").exists());
    assert!(!ws.join("agents/hame/anonymous").exists());
    assert!(!ws.join("agents/hame/users").exists());
    // Runtime data is private to the host user.
    assert_eq!(mode(&sessions.join("default.log.jsonl"))?, 0o600);
    assert_eq!(mode(&sessions.join("index/default.json"))?, 0o600);
    assert_eq!(mode(&sessions)?, 0o700);
    Ok(())
}

#[tokio::test]
async fn a_user_s_runtime_data_sits_under_its_folder() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_s = ws.to_string_lossy().into_owned();
    server.push_all([ScriptStep::text("hi")]);
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &ws_s, "--user", "alice", "--session", "s1"],
        "hello",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ws.join("alice/agents/hame/sessions/s1.log.jsonl").is_file());
    assert!(
        ws.join("alice/agents/hame/sessions/index/s1.json")
            .is_file()
    );
    assert!(!ws.join("agents/hame/users").exists());
    assert!(!ws.join("agents/hame/sessions").exists());
    Ok(())
}

#[tokio::test]
async fn session_logs_are_not_writable_and_walks_skip_them() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    fs::write(ws.join("notes.md"), "needle-1\n")?;
    let ws_s = ws.to_string_lossy().into_owned();
    let args = ["--workspace", ws_s.as_str()];
    // A first call puts "needle" in the log.
    server.push_all([ScriptStep::text("noted")]);
    run_with(
        dir.path(),
        &server.base_url(),
        &args,
        "remember needle",
        &[],
    )
    .await?;
    let log = ws.join("agents/hame/sessions/default.log.jsonl");
    let before = fs::read_to_string(&log)?;
    let call = ScriptToolCall::new;
    let path = "agents/hame/sessions/default.log.jsonl";
    server.push_all([
        // Read first, so write_file's read-before-overwrite rule is not what refuses.
        ScriptStep::tool_calls(vec![
            call("e7", "read_file", &json!({"file_path": path})),
            call(
                "e0",
                "read_file",
                &json!({"file_path": "agents/hame/sessions/index/default.json"}),
            ),
        ]),
        ScriptStep::tool_calls(vec![
            call(
                "e1",
                "edit_file",
                &json!({"file_path": path, "old_string": "needle", "new_string": "forged"}),
            ),
            call(
                "e2",
                "write_file",
                &json!({"file_path": path, "content": "forged"}),
            ),
            call(
                "e3",
                "write_file",
                &json!({"file_path": "agents/hame/sessions/index/default.json", "content": "{}"}),
            ),
            call("e4", "grep_files", &json!({"pattern": "needle"})),
            call("e5", "glob_files", &json!({"pattern": "**/*.jsonl"})),
            call("e6", "list_files", &json!({"path": "/"})),
        ]),
        ScriptStep::text("done"),
    ]);
    let out = run_with(dir.path(), &server.base_url(), &args, "try", &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all = tool_results(&server);
    // Named, the log is readable.
    assert!(all[0].contains("remember needle"), "{}", all[0]);
    let r = &all[2..];
    for (i, res) in r[..3].iter().enumerate() {
        assert!(res.contains("permission_denied"), "{i}: {res}");
    }
    assert!(
        r[3].contains("notes.md") && !r[3].contains(".log.jsonl"),
        "{}",
        r[3]
    );
    assert!(!r[4].contains(".log.jsonl"), "{}", r[4]);
    assert!(!r[5].contains("agents"), "{}", r[5]);
    assert!(fs::read_to_string(&log)?.starts_with(&before));
    assert!(!fs::read_to_string(&log)?.contains("forged\""));
    Ok(())
}

#[tokio::test]
async fn two_workspaces_never_share_a_conversation() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    fs::create_dir_all(&one)?;
    fs::create_dir_all(&two)?;
    server.push_all([ScriptStep::text("a"), ScriptStep::text("b")]);
    for (ws, msg) in [(&one, "first-workspace-secret"), (&two, "hello")] {
        let ws_s = ws.to_string_lossy().into_owned();
        let out = run_with(
            dir.path(),
            &server.base_url(),
            &["--workspace", &ws_s],
            msg,
            &[],
        )
        .await?;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let reqs = server.requests();
    let second = serde_json::to_string(&reqs[1].body["messages"])?;
    assert!(!second.contains("first-workspace-secret"), "{second}");
    Ok(())
}

#[tokio::test]
async fn a_state_home_inside_the_workspace_is_hidden() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_s = ws.to_string_lossy().into_owned();
    let state = ws.join(".hame/state");
    let state_s = state.to_string_lossy().into_owned();
    server.push_all([ScriptStep::text("first-call-marker")]);
    run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &ws_s],
        "hi",
        &[("HAME_STATE_HOME", &state_s)],
    )
    .await?;
    let call = ScriptToolCall::new;
    server.push_all([
        ScriptStep::tool_calls(vec![
            call("g1", "grep_files", &json!({"pattern": "first-call-marker"})),
            call("g2", "glob_files", &json!({"pattern": "**/*.json"})),
            call("g3", "list_files", &json!({"path": ".hame/state"})),
        ]),
        ScriptStep::text("done"),
    ]);
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &ws_s],
        "look",
        &[("HAME_STATE_HOME", &state_s)],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = tool_results(&server);
    assert!(!r[0].contains(".hame/state"), "{}", r[0]);
    assert!(!r[1].contains(".hame/state"), "{}", r[1]);
    assert!(!r[2].contains("ws-"), "{}", r[2]);
    // The state home is private.
    assert_eq!(
        mode(&state.join(hame::harness::workspace_identity(&ws)))?,
        0o700
    );
    Ok(())
}

#[tokio::test]
async fn no_secret_is_reachable_from_the_shell() -> TestResult {
    let server = ScriptedServer::start().await?;
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_s = ws.to_string_lossy().into_owned();
    server.push_all([
        ScriptStep::tool_call(
            "x1",
            "execute",
            json!({"command": "cat /proc/self/environ; echo; cat /proc/$PPID/environ; echo; ps eww -u root 2>&1; env"}),
        ),
        ScriptStep::text("done"),
    ]);
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &ws_s],
        "leak",
        &[
            ("OPENAI_API_KEY", "sk-topsecret-123"),
            ("AWS_SECRET_ACCESS_KEY", "aws-topsecret-456"),
            ("HAME_DB_PASSWORD", "pw-topsecret-789"),
            ("HAME_STATE_URL_X", "redis://u:url-topsecret@127.0.0.1:1/0"),
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "done\n");
    let r = tool_results(&server);
    assert!(r[0].len() > 20, "the commands ran: {}", r[0]);
    for secret in [
        "sk-topsecret",
        "aws-topsecret",
        "pw-topsecret",
        "url-topsecret",
    ] {
        assert!(!r[0].contains(secret), "{secret} leaked: {}", r[0]);
    }
    Ok(())
}
