//! The CLI conventions of issue #36: a chat that shows its work (tool arguments, a spinner
//! on a terminal only, `/usage`, `/context`), `--continue` and `--resume`.

use std::time::Duration;

use hame_test_support::{ScriptStep, ScriptUsage, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{chat, hame, on_a_terminal, output, run_with, stderr, stdout, texts_of_role};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A scripted server and the environment of `hame` against it, state under `dir/state`.
async fn server(
    dir: &std::path::Path,
    steps: Vec<ScriptStep>,
) -> Result<(ScriptedServer, Vec<(String, String)>), Box<dyn std::error::Error>> {
    let server = ScriptedServer::start().await?;
    server.push_all(steps);
    let env = vec![
        ("OPENAI_BASE_URL".to_owned(), server.base_url()),
        ("OPENAI_API_KEY".to_owned(), "scripted".to_owned()),
        (
            "HAME_STATE_HOME".to_owned(),
            dir.join("state").to_string_lossy().into_owned(),
        ),
        ("HAME_MODEL".to_owned(), "openai:m".to_owned()),
    ];
    Ok((server, env))
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[tokio::test]
async fn chat_shows_tool_arguments_and_off_a_terminal_no_spinner() -> TestResult {
    let dir = tempfile::tempdir()?;
    let long = "x".repeat(100);
    let (_server, env) = server(
        dir.path(),
        vec![
            ScriptStep::tool_call(
                "c1",
                "grep_files",
                serde_json::json!({"pattern": "TODO", "path": "src"}),
            ),
            ScriptStep::tool_call(
                "c2",
                "execute",
                serde_json::json!({"command": format!("echo {long}\necho two")}),
            ),
            ScriptStep::text("done").with_delay(Duration::from_millis(300)),
        ],
    )
    .await?;
    let out = chat(dir.path(), &[], &pairs(&env), "look\n/exit\n").await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("⚙ grep_files path=src pattern=TODO …"),
        "{err}"
    );
    // A long command is one line, clipped to 60 characters.
    let clipped = format!("echo {}…", "x".repeat(54));
    assert!(
        err.contains(&format!("⚙ execute command=\"{clipped}\" …")),
        "{err}"
    );
    // No spinner, no carriage return, no escape sequence in a pipe.
    assert!(!err.contains("waiting for the model"), "{err}");
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err:?}");
    assert!(stdout(&out).contains("done"), "{}", stdout(&out));
    Ok(())
}

#[tokio::test]
async fn on_a_terminal_chat_shows_a_spinner_while_the_model_thinks() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (_server, env) = server(
        dir.path(),
        vec![ScriptStep::text("late answer").with_delay(Duration::from_millis(800))],
    )
    .await?;
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "hello\n/exit\n")?;
    let cmd = hame(&["chat"], &pairs(&env), dir.path());
    let Some(term) = on_a_terminal(&cmd, &input) else {
        eprintln!("SKIPPED: no `script` to make a terminal");
        return Ok(());
    };
    let out = output(term).await?;
    let screen = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{screen}");
    assert!(screen.contains("waiting for the model 0."), "{screen:?}");
    // The spinner's line is erased before the answer.
    let answer = screen.find("late answer").unwrap_or(0);
    let erased = screen[..answer].rfind("\r\x1b[2K").unwrap_or(usize::MAX);
    assert!(erased < answer, "{screen:?}");
    Ok(())
}

#[tokio::test]
async fn usage_and_context_report_the_session() -> TestResult {
    let dir = tempfile::tempdir()?;
    let usage = ScriptUsage {
        input_tokens: 1_500,
        output_tokens: 20,
        cached_input_tokens: 1_024,
    };
    let (_server, env) = server(
        dir.path(),
        vec![
            ScriptStep::text("one").with_cached_usage(usage),
            ScriptStep::text("two").with_cached_usage(usage),
        ],
    )
    .await?;
    let out = chat(
        dir.path(),
        &[],
        &pairs(&env),
        "first\nsecond\n/usage\n/context\n/exit\n",
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "session default: 3,000 input tokens (2,048 cached), 40 output tokens, 3,040 in all"
        ),
        "{err}"
    );
    assert!(
        err.contains("session default: 4 messages (2 user, 2 assistant, 0 tool results), ~"),
        "{err}"
    );
    assert!(
        err.contains("last request: 1,500 input tokens (1,024 cached)"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn continue_and_resume_pick_a_session() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (server, env) = server(dir.path(), vec![]).await?;
    server.set_responder(|_: &hame_test_support::RecordedRequest| ScriptStep::text("ok"));
    let base = server.base_url();
    let env = pairs(&env);
    // Nothing to continue yet: exit 2 naming the flag.
    let out = run_with(dir.path(), &base, &["--continue"], "x", &env).await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no session to continue"),
        "{}",
        stderr(&out)
    );
    for (session, text) in [("a", "first of a"), ("b", "first of b")] {
        let out = run_with(dir.path(), &base, &["--session", session], text, &env).await?;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    // `chat --continue` picks up b, the latest.
    let out = chat(dir.path(), &["--continue"], &env, "more\n/exit\n").await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("hame: continuing session b (2 messages"),
        "{}",
        stderr(&out)
    );
    let last = server.requests().pop().map(|r| r.body).unwrap_or_default();
    assert_eq!(texts_of_role(&last, "user"), vec!["first of b", "more"]);
    // `run --resume a` goes back to a.
    let out = run_with(dir.path(), &base, &["--resume", "a"], "again", &env).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let last = server.requests().pop().map(|r| r.body).unwrap_or_default();
    assert_eq!(texts_of_role(&last, "user"), vec!["first of a", "again"]);
    // An unknown id, and no id without a terminal: exit 2, one line each, no model call.
    let before = server.requests().len();
    let out = run_with(dir.path(), &base, &["--resume", "zz"], "x", &env).await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no session \"zz\"") && stderr(&out).contains("hame sessions"),
        "{}",
        stderr(&out)
    );
    let out = chat(dir.path(), &["--resume"], &env, "x\n").await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "hame: --resume without an ID lists the sessions to pick from on a terminal; pass \
         --resume ID (`hame sessions` lists them) or --continue for the latest\n"
    );
    assert_eq!(server.requests().len(), before);
    Ok(())
}

#[tokio::test]
async fn help_groups_the_commands_and_puts_the_common_flags_first() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = output(hame(&["--help"], &[], dir.path())).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let help = stdout(&out);
    let headings: Vec<&str> = help
        .lines()
        .filter(|l| l.ends_with(':') && !l.starts_with(' '))
        .collect();
    assert_eq!(
        headings,
        vec![
            "Run an agent:",
            "Inspect:",
            "Workspace:",
            "Admin:",
            "Options:"
        ]
    );
    // One line per command.
    assert!(
        help.lines()
            .any(|l| l == "  run       One call: prints the final reply on stdout"),
        "{help}"
    );
    assert!(
        help.lines()
            .all(|l| l.chars().count() <= 100 || l.contains("--otlp")),
        "{help}"
    );
    let out = output(hame(&["run", "-h"], &[], dir.path())).await?;
    let help = stdout(&out);
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| {
            l.trim_start()
                .strip_prefix("--")
                .or_else(|| l.trim_start().strip_prefix("-c, --"))
        })
        .filter_map(|l| l.split([' ', '<']).next())
        .take(6)
        .collect();
    assert_eq!(
        flags,
        vec!["workspace", "agent", "user", "session", "model", "base-url"]
    );
    Ok(())
}

/// One `hame run` whose model calls `tool` with `args` once, then answers "done".
async fn run_tool(
    dir: &std::path::Path,
    flags: &[&str],
    tool: &str,
    args: serde_json::Value,
    extra_env: &[(&str, &str)],
) -> Result<(std::process::Output, ScriptedServer), Box<dyn std::error::Error>> {
    let steps = vec![
        ScriptStep::tool_call("c1", tool, args),
        ScriptStep::text("done"),
    ];
    super::common::run_script(dir, flags, "go", steps, extra_env).await
}

#[tokio::test]
async fn permission_mode_read_only_refuses_a_write_and_says_why() -> TestResult {
    let dir = tempfile::tempdir()?;
    let write = serde_json::json!({"file_path": "notes.txt", "content": "x"});
    let (out, server) = run_tool(
        dir.path(),
        &["--permission-mode", "read-only"],
        "write_file",
        write,
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).lines().last(),
        Some("hame: denied: write_file notes.txt (mode read-only)")
    );
    assert!(!dir.path().join(".hame/workspace/notes.txt").exists());
    let result = super::common::tool_results(&server).join("\n");
    assert!(
        result.contains("is blocked: the permission mode is read-only"),
        "{result}"
    );
    Ok(())
}

#[tokio::test]
async fn permission_modes_from_flag_environment_and_init() -> TestResult {
    let dir = tempfile::tempdir()?;
    let write = || serde_json::json!({"file_path": "a.txt", "content": "x"});
    let shell = serde_json::json!({"command": "echo hi"});
    // accept-edits: the edit runs, the shell waits for a decision (exit 3).
    let (out, _) = run_tool(
        dir.path(),
        &["--permission-mode", "accept-edits"],
        "write_file",
        write(),
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (out, _) = run_tool(
        dir.path(),
        &["--session", "s2"],
        "execute",
        shell.clone(),
        &[("HAME_PERMISSION_MODE", "accept-edits")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(rule `mode accept-edits`)"),
        "{}",
        stderr(&out)
    );
    // plan: plan mode of the session, as --plan.
    let (out, server) = run_tool(
        dir.path(),
        &["--session", "s3", "--permission-mode", "plan"],
        "write_file",
        write(),
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result = super::common::tool_results(&server).join("\n");
    assert!(result.contains("the session is in plan mode"), "{result}");
    // A value that is no mode: exit 2 naming the variable and the modes.
    let (out, _) = run_tool(
        dir.path(),
        &[],
        "read_file",
        serde_json::json!({}),
        &[("HAME_PERMISSION_MODE", "yolo")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("HAME_PERMISSION_MODE=\"yolo\": expected default, ask, accept-edits, plan, read-only, bypass"),
        "{}",
        stderr(&out)
    );
    // `hame init` writes `ask`: reads run, a write and the shell wait for a decision.
    let ws = dir.path().join("ws");
    let out = output(hame(&["init", &ws.to_string_lossy()], &[], dir.path())).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ws_flag = ["--workspace", "ws"];
    let (out, _) = run_tool(
        dir.path(),
        &ws_flag,
        "list_files",
        serde_json::json!({}),
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for (session, tool, args) in [("w", "write_file", write()), ("x", "execute", shell)] {
        let flags = ["--workspace", "ws", "--session", session];
        let (out, _) = run_tool(dir.path(), &flags, tool, args, &[]).await?;
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("(rule `mode ask`)"),
            "{}",
            stderr(&out)
        );
    }
    assert!(!ws.join("a.txt").exists());
    // The flag beats the file.
    let flags = [
        "--workspace",
        "ws",
        "--session",
        "y",
        "--permission-mode",
        "accept-edits",
    ];
    let (out, _) = run_tool(dir.path(), &flags, "write_file", write(), &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ws.join("a.txt").exists());
    Ok(())
}

#[tokio::test]
async fn endpoints_that_are_not_models_fail_in_one_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    // A web server at the endpoint: one line naming the URL, status and content type.
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::html_page(501, "Error response"));
    let started = std::time::Instant::now();
    let out = run_with(dir.path(), &server.base_url(), &[], "hi", &[]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("hame: invalid response: http://127.0.0.1:")
            && last.contains("/v1/chat/completions answered HTTP 501 (text/html, ")
            && last.ends_with(
                "title \"Error response\"), not a model API's JSON; check OPENAI_BASE_URL"
            ),
        "{err}"
    );
    assert_eq!(server.request_count(), 1);
    assert!(started.elapsed() < Duration::from_secs(10));
    // A server that accepts and never answers: the first-byte timeout of hame.toml.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let base = format!("http://{}/v1", silent.local_addr()?);
    std::fs::create_dir_all(dir.path().join("ws"))?;
    std::fs::write(dir.path().join("ws/hame.toml"), "model_timeout = 1.5\n")?;
    let started = std::time::Instant::now();
    let out = run_with(dir.path(), &base, &["--workspace", "ws"], "hi", &[]).await?;
    let elapsed = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "within 1.5 s; check OPENAI_BASE_URL, or for a slow model raise the first-byte timeout"
        ),
        "{}",
        stderr(&out)
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    // The flag beats the file; `hame config` says where each comes from.
    let out = output(hame(
        &[
            "config",
            "--workspace",
            "ws",
            "--model-connect-timeout",
            "2",
            "--json",
        ],
        &[],
        dir.path(),
    ))
    .await?;
    let config: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(config["settings"]["model_timeout"]["value"], 1.5);
    assert!(
        config["settings"]["model_timeout"]["source"]
            .as_str()
            .unwrap_or_default()
            .ends_with("hame.toml"),
        "{config}"
    );
    assert_eq!(config["settings"]["model_connect_timeout"]["value"], 2.0);
    assert_eq!(
        config["settings"]["model_connect_timeout"]["source"],
        "flag --model-connect-timeout"
    );
    drop(silent);
    // No key, no endpoint: the missing variable is named, nothing is sent.
    let out = output(hame(
        &[
            "run",
            "--workspace",
            "ws",
            "--model",
            "openai:gpt-4o-mini",
            "hi",
        ],
        &[],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("hame: configuration error: OPENAI_API_KEY is not set: https://api.openai.com/v1 needs a key"),
        "{}",
        stderr(&out)
    );
    // A command that does not call the model works without one.
    let out = output(hame(
        &[
            "sessions",
            "--workspace",
            "ws",
            "--model",
            "openai:gpt-4o-mini",
        ],
        &[(
            "HAME_STATE_HOME",
            &dir.path().join("state").to_string_lossy(),
        )],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    Ok(())
}
