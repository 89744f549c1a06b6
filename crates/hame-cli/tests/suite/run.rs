use std::fs;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{hame, output, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn workspace() -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    fs::create_dir_all(dir.path().join("ws/knowledge"))?;
    fs::write(
        dir.path().join("ws/AGENTS.md"),
        "You are Hamish, a terse assistant.\n",
    )?;
    Ok(dir)
}

#[tokio::test]
async fn run_prints_reply_with_agents_md_in_prompt() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("Hello from the script."));
    let dir = workspace()?;
    let base = server.base_url();
    let ws = dir.path().join("ws");
    let ws = ws.to_string_lossy();
    let out = output(hame(
        &["run", "--workspace", &ws, "hi"],
        &[
            ("OPENAI_BASE_URL", &base),
            ("OPENAI_API_KEY", "k"),
            ("HAME_MODEL", "openai:gpt-4o-mini"),
        ],
        dir.path(),
    ))
    .await?;
    assert_eq!(stderr(&out), "");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "Hello from the script.\n");
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    let body = &reqs[0].body;
    assert_eq!(body["model"], "gpt-4o-mini");
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    assert_eq!(body["messages"][0]["role"], "system");
    assert!(
        system.contains("You are Hamish, a terse assistant."),
        "{system}"
    );
    assert!(system.contains("- Session: default"), "{system}");
    assert_eq!(body["messages"][1]["content"], "hi");
    Ok(())
}

#[tokio::test]
async fn json_output() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("ok").with_usage(12, 3));
    let dir = workspace()?;
    let base = server.base_url();
    let ws = dir.path().join("ws");
    let ws = ws.to_string_lossy();
    let out = output(hame(
        &[
            "run",
            "--json",
            "--workspace",
            &ws,
            "--user",
            "alice",
            "--session",
            "s-1",
            "--model",
            "openai:m",
            "hi",
        ],
        &[("OPENAI_BASE_URL", &base)],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim())?;
    assert_eq!(v["reply"], "ok");
    assert_eq!(v["session"], "s-1");
    assert_eq!(v["user"], "alice");
    assert_eq!(v["agent"], "hame");
    assert_eq!(v["usage"]["input_tokens"], 12);
    assert_eq!(v["usage"]["output_tokens"], 3);
    Ok(())
}

#[tokio::test]
async fn configuration_errors_exit_2_with_one_line() -> TestResult {
    let dir = workspace()?;
    let ws = dir.path().join("ws");
    let ws = ws.to_string_lossy().into_owned();
    let file = dir.path().join("ws/AGENTS.md");
    let file = file.to_string_lossy().into_owned();
    // `hame run --workspace WS --model openai:m <extra> hi`
    let with = |extra: &[&'static str]| -> Vec<String> {
        let mut a: Vec<String> = ["run", "--workspace", &ws, "--model", "openai:m"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a.push("hi".into());
        a
    };
    let owned = |v: &[&str]| -> Vec<String> { v.iter().map(|s| (*s).to_owned()).collect() };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (owned(&["run", "--workspace", &ws, "hi"]), "HAME_MODEL"),
        (
            owned(&["run", "--workspace", &ws, "--model", "nosuch:x", "hi"]),
            "nosuch",
        ),
        (
            owned(&["run", "--workspace", &file, "--model", "openai:m", "hi"]),
            "not a directory",
        ),
        (with(&["--session", "../x"]), "session id"),
        (with(&["--user", "a/b"]), "user id"),
        (with(&["--session", "a..b"]), "session id"),
        (with(&["--session", "_memory"]), "reserved"),
        (
            with(&["--state", "redis://:hunter2@127.0.0.1:9/0"]),
            "redis://:***@127.0.0.1:9/0",
        ),
        (
            with(&["--store", "s3://bucket/prefix"]),
            "AWS_ACCESS_KEY_ID",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = output(hame(
            &args,
            &[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")],
            dir.path(),
        ))
        .await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        assert_eq!(stdout(&out), "");
    }
    Ok(())
}

#[tokio::test]
async fn a_memory_index_that_is_not_hame_s_is_refused_and_kept() -> TestResult {
    let dir = workspace()?;
    let ws = dir.path().join("ws");
    let ws = ws.to_string_lossy().into_owned();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "my precious notes\n")?;
    let notes_arg = notes.to_string_lossy().into_owned();
    let out = output(hame(
        &[
            "run",
            "--workspace",
            &ws,
            "--model",
            "openai:m",
            "--memory-index",
            &notes_arg,
            "hi",
        ],
        &[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")],
        dir.path(),
    ))
    .await?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("notes.txt") && err.contains("not a hame search index"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&notes)?, "my precious notes\n");
    Ok(())
}

#[tokio::test]
async fn rejected_key_exits_1_and_names_the_key() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::unauthorized());
    let dir = workspace()?;
    let base = server.base_url();
    let out = output(hame(
        &["run", "--model", "openai:m", "hi"],
        &[("OPENAI_BASE_URL", &base), ("OPENAI_API_KEY", "wrong")],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("OPENAI_API_KEY"), "{}", stderr(&out));
    assert_eq!(server.requests().len(), 1, "401 must not be retried");
    Ok(())
}

#[tokio::test]
async fn default_workspace_is_dot_hame() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("ok"));
    let dir = tempfile::tempdir()?;
    fs::create_dir_all(dir.path().join(".hame/workspace"))?;
    fs::write(
        dir.path().join(".hame/workspace/AGENTS.md"),
        "persona-from-default-workspace",
    )?;
    let base = server.base_url();
    let out = output(hame(
        &["run", "--model", "openai:m", "hi"],
        &[("OPENAI_BASE_URL", &base)],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let system = server.requests()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        system.contains("persona-from-default-workspace"),
        "{system}"
    );
    Ok(())
}

#[tokio::test]
async fn chat_streams_tokens_and_shows_tool_calls() -> TestResult {
    use std::io::Write;
    use std::process::Stdio;

    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "list_files", serde_json::json!({"path": "."})),
        ScriptStep::text("Here are your files."),
        ScriptStep::text("Second answer."),
    ]);
    let dir = workspace()?;
    let base = server.base_url();
    let ws = dir.path().join("ws");
    let ws = ws.to_string_lossy().into_owned();
    let state = dir.path().join("state");
    let state = state.to_string_lossy().into_owned();
    let mut cmd = hame(
        &["chat", "--workspace", &ws, "--model", "openai:m"],
        &[("OPENAI_BASE_URL", &base), ("HAME_STATE_HOME", &state)],
        dir.path(),
    );
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || -> std::io::Result<std::process::Output> {
        let mut child = cmd.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(b"list my files\nand again\n")?;
        }
        child.wait_with_output()
    })
    .await??;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Here are your files.\nSecond answer.\n");
    let err = stderr(&out);
    assert!(err.contains("list_files ok ("), "{err}");
    assert!(err.contains(" ms)"), "{err}");
    // Both turns went to the same session: the second request carries the first exchange.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    let history = serde_json::to_string(&reqs[2].body["messages"])?;
    assert!(
        history.contains("list my files") && history.contains("Here are your files."),
        "{history}"
    );
    Ok(())
}

#[tokio::test]
async fn max_iterations_zero_is_refused_when_parsed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = output(hame(
        &["run", "--model", "openai:m", "--max-iterations", "0", "hi"],
        &[],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("must be at least 1"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

#[tokio::test]
async fn log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("ok"));
    let dir = workspace()?;
    let out = super::common::run_with(
        dir.path(),
        &server.base_url(),
        &[],
        "hi",
        &[("HAME_LOG", "debug")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("DEBUG"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
    Ok(())
}

/// Every file under `root` with its bytes, by path relative to `root`.
fn tree(root: &std::path::Path) -> std::io::Result<std::collections::BTreeMap<String, Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap_or(&path);
                out.insert(rel.to_string_lossy().into_owned(), fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

/// A session state written by a newer hame — a newer storage format (`format:
/// hame-state/99`) or a newer schema version — is refused before anything is written:
/// exit 2, one line naming the version, no model request, every file byte-identical (the
/// session's lease lock file aside, which counts the attempt).
#[tokio::test]
async fn state_of_a_newer_hame_exits_2_and_writes_nothing() -> TestResult {
    for (field, found) in [("format", "hame-state/99"), ("schema_version", "99")] {
        let dir = workspace()?;
        let ws = dir.path().join("ws");
        let ws_arg = ws.to_string_lossy().into_owned();
        let args = ["--workspace", ws_arg.as_str(), "--session", "s1"];
        let call = |message: &'static str, reply: &'static str| {
            super::common::run_script(
                dir.path(),
                &args,
                message,
                vec![ScriptStep::text(reply)],
                &[],
            )
        };
        let (first, _) = call("hi", "first reply").await?;
        assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
        let doc_path = super::common::state_dir(dir.path(), &ws).join("hame/anonymous/s1.json");
        let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&doc_path)?)?;
        match field {
            "format" => doc["format"] = serde_json::json!(found),
            _ => doc["state"]["schema_version"] = serde_json::json!(99),
        }
        fs::write(&doc_path, serde_json::to_vec(&doc)?)?;
        let before = tree(dir.path())?;

        let (out, server) = call("again", "must not be asked").await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{field}: {err}");
        assert_eq!(err.lines().count(), 1, "{field}: {err}");
        assert!(
            err.starts_with("hame: ") && err.contains(found),
            "{field}: {err}"
        );
        assert!(err.contains("newer"), "{field}: {err}");
        assert_eq!(server.requests().len(), 0, "{field}: the model was asked");
        let after = tree(dir.path())?;
        assert_eq!(
            before.keys().collect::<Vec<_>>(),
            after.keys().collect::<Vec<_>>(),
            "{field}: files were created or removed"
        );
        for (path, bytes) in &before {
            if path.ends_with(".lease") {
                // The session's lock file: taking and releasing the lease counts its fence
                // up, as every call does; it holds no state, and it is released.
                let lease: serde_json::Value = serde_json::from_slice(&after[path])?;
                assert_eq!(lease["token"], "", "{field}: the lease was not released");
                continue;
            }
            assert!(after.get(path) == Some(bytes), "{field}: {path} changed");
        }
    }
    Ok(())
}

/// `hame run --image FILE`: the model's request carries the file inline with its exact
/// bytes, the session log keeps the block; a file that is not an image, a missing one and
/// an oversized one each end with one line that names it, before any model request.
#[tokio::test]
async fn run_sends_an_image_file_inline_and_refuses_what_is_not_one() -> TestResult {
    use base64::Engine as _;
    let dir = workspace()?;
    let ws = dir.path().join("ws");
    let ws_arg = ws.to_string_lossy().into_owned();
    // A 1x1 GIF.
    let gif = base64::engine::general_purpose::STANDARD
        .decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")?;
    fs::write(dir.path().join("dot.gif"), &gif)?;
    fs::write(dir.path().join("notes.png"), "not an image")?;
    let mut big = b"\x89PNG\r\n\x1a\n".to_vec();
    big.resize(hame::ImageBlock::MAX_BYTES + 1, 0);
    fs::write(dir.path().join("big.png"), big)?;
    let (out, server) = super::common::run_script(
        dir.path(),
        &[
            "--workspace",
            &ws_arg,
            "--session",
            "pic",
            "--image",
            "dot.gif",
        ],
        "what is this?",
        vec![ScriptStep::text("A dot.")],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "A dot.");
    let url = format!(
        "data:image/gif;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&gif)
    );
    let user: Vec<serde_json::Value> = server.requests()[0].body["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "user").cloned().collect())
        .unwrap_or_default();
    assert_eq!(
        user,
        vec![serde_json::json!({"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}}
        ]})]
    );
    let log = fs::read_to_string(ws.join("agents/hame/sessions/pic.log.jsonl"))?;
    let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap_or("{}"))?;
    assert_eq!(first["message"]["content"][1]["type"], "image");
    assert_eq!(first["message"]["content"][1]["media_type"], "image/gif");
    for (file, says) in [
        (
            "notes.png",
            "notes.png is not a PNG, JPEG, GIF or WebP image",
        ),
        ("missing.png", "cannot read image missing.png"),
        ("big.png", "image big.png is larger than 5 MiB"),
    ] {
        let (out, server) = super::common::run_script(
            dir.path(),
            &["--workspace", &ws_arg, "--image", file],
            "what is this?",
            vec![ScriptStep::text("must not be asked")],
            &[],
        )
        .await?;
        let err = stderr(&out);
        assert_ne!(out.status.code(), Some(0), "{file}");
        assert_eq!(err.lines().count(), 1, "{file}: {err}");
        assert!(err.contains(says), "{file}: {err}");
        assert_eq!(server.requests().len(), 0, "{file}: the model was asked");
    }
    Ok(())
}
