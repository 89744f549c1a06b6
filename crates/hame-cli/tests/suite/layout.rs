//! Local mode as the reference defines it: the file tools and the shell work on the
//! workspace itself, runtime data at the reference layout, session logs out of the tools'
//! reach, state per workspace, secrets out of the shell's reach, private file modes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use hame_test_support::{ScriptStep, ScriptToolCall};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{Scratch, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn mode(p: &Path) -> std::io::Result<u32> {
    Ok(fs::metadata(p)?.permissions().mode() & 0o777)
}

#[tokio::test]
async fn file_tools_and_shell_share_the_workspace() -> TestResult {
    let s = Scratch::scripted([
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
    ])
    .await?;
    let ws = &s.ws;
    s.write("mine.txt", "colour: red\n")?;
    s.run_ws(&[], "go").await?;
    let results = s.results();
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
    let s = Scratch::scripted([ScriptStep::text("hi")]).await?;
    let ws = &s.ws;
    s.run_ws(&["--user", "alice", "--session", "s1"], "hello")
        .await?;
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
    // A first call puts "needle" in the log.
    let s = Scratch::scripted([ScriptStep::text("noted")]).await?;
    s.write("notes.md", "needle-1\n")?;
    s.run(&s.ws_args(&[]), "remember needle", &[]).await?;
    let log = s.ws.join("agents/hame/sessions/default.log.jsonl");
    let before = fs::read_to_string(&log)?;
    let call = ScriptToolCall::new;
    let path = "agents/hame/sessions/default.log.jsonl";
    s.server.push_all([
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
    s.run_ws(&[], "try").await?;
    let all = s.results();
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
    let s = Scratch::scripted([ScriptStep::text("a"), ScriptStep::text("b")]).await?;
    let two = s.path().join("two");
    fs::create_dir_all(&two)?;
    let two_s = two.to_string_lossy().into_owned();
    for (ws, msg) in [(&s.ws_s, "first-workspace-secret"), (&two_s, "hello")] {
        s.run_code(0, &["--workspace", ws], msg, &[]).await?;
    }
    let reqs = s.server.requests();
    let second = serde_json::to_string(&reqs[1].body["messages"])?;
    assert!(!second.contains("first-workspace-secret"), "{second}");
    Ok(())
}

#[tokio::test]
async fn a_state_home_inside_the_workspace_is_hidden() -> TestResult {
    let s = Scratch::scripted([ScriptStep::text("first-call-marker")]).await?;
    let state = s.ws.join(".hame/state");
    let state_s = state.to_string_lossy().into_owned();
    let env = [("HAME_STATE_HOME", state_s.as_str())];
    s.run(&s.ws_args(&[]), "hi", &env).await?;
    let call = ScriptToolCall::new;
    s.server.push_all([
        ScriptStep::tool_calls(vec![
            call("g1", "grep_files", &json!({"pattern": "first-call-marker"})),
            call("g2", "glob_files", &json!({"pattern": "**/*.json"})),
            call("g3", "list_files", &json!({"path": ".hame/state"})),
        ]),
        ScriptStep::text("done"),
    ]);
    s.run_code(0, &s.ws_args(&[]), "look", &env).await?;
    let r = s.results();
    assert!(!r[0].contains(".hame/state"), "{}", r[0]);
    assert!(!r[1].contains(".hame/state"), "{}", r[1]);
    assert!(!r[2].contains("ws-"), "{}", r[2]);
    // The state home is private.
    assert_eq!(
        mode(&state.join(hame::harness::workspace_identity(&s.ws)))?,
        0o700
    );
    Ok(())
}

#[tokio::test]
async fn no_secret_is_reachable_from_the_shell() -> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "x1",
            "execute",
            json!({"command": "cat /proc/self/environ; echo; cat /proc/$PPID/environ; echo; ps eww -u root 2>&1; env"}),
        ),
        ScriptStep::text("done"),
    ])
    .await?;
    let out = s
        .run_code(
            0,
            &s.ws_args(&[]),
            "leak",
            &[
                ("OPENAI_API_KEY", "sk-topsecret-123"),
                ("AWS_SECRET_ACCESS_KEY", "aws-topsecret-456"),
                ("HAME_DB_PASSWORD", "pw-topsecret-789"),
                ("HAME_STATE_URL_X", "redis://u:url-topsecret@127.0.0.1:1/0"),
            ],
        )
        .await?;
    assert_eq!(stdout(&out), "done\n");
    let r = s.results();
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
