//! The first hour of a new user (issue #17): `hame init`, the configuration files and
//! `hame config`, the workspace that must exist, the offline demo script.

use std::fs;
use std::path::Path;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{Scratch, chat, hame, output, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[tokio::test]
async fn init_creates_a_starter_workspace_that_runs_and_never_overwrites() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("my ws");
    let out = output(hame(&["init", &s(&ws)], &[], dir.path())).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    let created: Vec<String> = stdout(&out)
        .lines()
        .filter_map(|l| l.strip_prefix("created "))
        .map(str::to_owned)
        .collect();
    let expected: Vec<String> = [
        "AGENTS.md",
        "knowledge/KNOWLEDGE.md",
        "skills/summarize/SKILL.md",
        "subagents/reviewer.md",
        "hame.toml",
    ]
    .iter()
    .map(|f| s(&ws.join(f)))
    .collect();
    assert_eq!(created, expected);
    assert!(stdout(&out).contains(&format!("--workspace '{}'", s(&ws))));

    // The starter workspace is valid: the skill is listed, the subagent spec is offered,
    // the persona is in the prompt, and no warning is printed.
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("ok"));
    let state = dir.path().join("state");
    let out = output(hame(
        &["run", "--workspace", &s(&ws), "--model", "openai:m", "hi"],
        &[
            ("OPENAI_BASE_URL", &server.base_url()),
            ("HAME_STATE_HOME", &s(&state)),
        ],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    let body = &server.requests()[0].body;
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(
        system.contains("You are a helpful, terse assistant"),
        "{system}"
    );
    assert!(system.contains("summarize"), "{system}");
    assert!(serde_json::to_string(body)?.contains("reviewer"));
    let skills = output(hame(
        &["skills", "list", "--workspace", &s(&ws)],
        &[("HAME_STATE_HOME", &s(&state))],
        dir.path(),
    ))
    .await?;
    assert_eq!(stderr(&skills), "");
    assert!(stdout(&skills).starts_with("summarize\tworkspace\tactive\t"));

    // A second init keeps every file, says so, and still succeeds.
    fs::write(ws.join("AGENTS.md"), "mine")?;
    let again = output(hame(&["init", &s(&ws)], &[], dir.path())).await?;
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(stdout(&again), "");
    let err = stderr(&again);
    assert!(
        err.contains(&format!("kept {} (exists)", s(&ws.join("AGENTS.md")))),
        "{err}"
    );
    assert!(err.contains("nothing changed"), "{err}");
    assert_eq!(fs::read_to_string(ws.join("AGENTS.md"))?, "mine");

    // A file where the workspace should be is exit 2.
    let file = dir.path().join("file");
    fs::write(&file, "x")?;
    let out = output(hame(&["init", &s(&file)], &[], dir.path())).await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
    Ok(())
}

#[tokio::test]
async fn init_without_a_dir_makes_the_default_workspace() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = output(hame(&["init"], &[], dir.path())).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(dir.path().join(".hame/workspace/AGENTS.md").is_file());
    Ok(())
}

#[tokio::test]
async fn a_workspace_that_does_not_exist_is_refused_and_points_at_init() -> TestResult {
    let dir = tempfile::tempdir()?;
    let typo = dir.path().join("my-wrokspace");
    for (args, env) in [
        (
            vec!["run", "--workspace", &s(&typo), "--model", "openai:m", "hi"],
            vec![],
        ),
        (
            vec!["run", "--model", "openai:m", "hi"],
            vec![("HAME_WORKSPACE", s(&typo))],
        ),
    ] {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = output(hame(&args, &env, dir.path())).await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("does not exist"), "{err}");
        assert!(err.contains(&format!("hame init {}", s(&typo))), "{err}");
        assert!(!typo.exists());
    }
    // The default workspace is still created on first use, with a note.
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("ok"));
    let out = output(hame(
        &["run", "--model", "openai:m", "hi"],
        &[("OPENAI_BASE_URL", &server.base_url())],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("hame: note: creating the default workspace .hame/workspace"),
        "{}",
        stderr(&out)
    );
    assert!(dir.path().join(".hame/workspace").is_dir());
    Ok(())
}

/// `hame config --json` in `cwd` with `args` and `env`: the settings object.
async fn config_json(
    cwd: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let mut all = vec!["config", "--json"];
    all.extend_from_slice(args);
    let out = output(hame(&all, env, cwd)).await?;
    if out.status.code() != Some(0) {
        return Err(format!("hame config failed: {}", stderr(&out)).into());
    }
    Ok(serde_json::from_str(&stdout(&out))?)
}

fn setting(v: &serde_json::Value, name: &str) -> (serde_json::Value, String) {
    let s = &v["settings"][name];
    (
        s["value"].clone(),
        s["source"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn config_precedence_flag_env_workspace_user_default() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_toml = ws.join("hame.toml");
    fs::write(
        &ws_toml,
        "model = \"openai:from-ws\"\nstate = \"postgres://u:hunter2@127.0.0.1/db\"\n[limits]\nmax_iterations = 7\n",
    )?;
    let xdg = dir.path().join("xdg");
    fs::create_dir_all(xdg.join("hame"))?;
    let user_toml = xdg.join("hame/config.toml");
    fs::write(
        &user_toml,
        "model = \"openai:from-user\"\nisolation = \"agent\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[limits]\nmax_iterations = 5\ntask_wait = 9\n[memory]\nenabled = false\n",
    )?;
    let wsa = s(&ws);
    let xdga = s(&xdg);
    let base = [("XDG_CONFIG_HOME", xdga.as_str())];
    // Files only: the workspace file wins over the user's file, the user's over defaults.
    let v = config_json(dir.path(), &["--workspace", &wsa], &base).await?;
    let ws_src = format!("file {}", s(&ws_toml));
    let user_src = format!("file {}", s(&user_toml));
    assert_eq!(
        setting(&v, "model"),
        ("openai:from-ws".into(), ws_src.clone())
    );
    assert_eq!(
        setting(&v, "limits.max_iterations"),
        (7.into(), ws_src.clone())
    );
    assert_eq!(
        setting(&v, "limits.task_wait"),
        (9.into(), user_src.clone())
    );
    assert_eq!(setting(&v, "isolation"), ("agent".into(), user_src.clone()));
    assert_eq!(
        setting(&v, "memory.enabled"),
        (false.into(), user_src.clone())
    );
    assert_eq!(
        setting(&v, "limits.subagent_depth"),
        (1.into(), "default".into())
    );
    // The password of a URL is never shown.
    assert_eq!(
        setting(&v, "state"),
        ("postgres://u:***@127.0.0.1/db".into(), ws_src.clone())
    );
    assert_eq!(v["files"], serde_json::json!([s(&ws_toml), s(&user_toml)]));
    // Environment over files; flags over environment.
    let env = [
        ("XDG_CONFIG_HOME", xdga.as_str()),
        ("HAME_MODEL", "openai:from-env"),
        ("HAME_MAX_ITERATIONS", "3"),
        ("OPENAI_BASE_URL", "http://127.0.0.1:2/v1"),
        ("OPENAI_API_KEY", "sk-secret"),
    ];
    let v = config_json(dir.path(), &["--workspace", &wsa], &env).await?;
    assert_eq!(
        setting(&v, "model"),
        ("openai:from-env".into(), "env HAME_MODEL".into())
    );
    assert_eq!(
        setting(&v, "limits.max_iterations"),
        (3.into(), "env HAME_MAX_ITERATIONS".into())
    );
    assert_eq!(
        setting(&v, "base_url"),
        ("http://127.0.0.1:2/v1".into(), "env OPENAI_BASE_URL".into())
    );
    assert_eq!(
        setting(&v, "api_key"),
        ("(set, redacted)".into(), "env OPENAI_API_KEY".into())
    );
    assert!(!v.to_string().contains("sk-secret"));
    let v = config_json(
        dir.path(),
        &[
            "--workspace",
            &wsa,
            "--model",
            "openai:from-flag",
            "--max-iterations",
            "2",
            "--isolation",
            "session",
        ],
        &env,
    )
    .await?;
    assert_eq!(
        setting(&v, "model"),
        ("openai:from-flag".into(), "flag --model".into())
    );
    assert_eq!(
        setting(&v, "limits.max_iterations"),
        (2.into(), "flag --max-iterations".into())
    );
    assert_eq!(
        setting(&v, "isolation"),
        ("session".into(), "flag --isolation".into())
    );
    // HAME_CONFIG names the user's file instead of XDG_CONFIG_HOME; it must exist.
    let other = dir.path().join("other.toml");
    fs::write(&other, "[limits]\nsubagent_depth = 0\n")?;
    let v = config_json(
        dir.path(),
        &["--workspace", &wsa],
        &[("XDG_CONFIG_HOME", &xdga), ("HAME_CONFIG", &s(&other))],
    )
    .await?;
    assert_eq!(
        setting(&v, "limits.subagent_depth"),
        (0.into(), format!("file {}", s(&other)))
    );
    let out = output(hame(
        &["config", "--workspace", &wsa],
        &[("HAME_CONFIG", &s(&dir.path().join("missing.toml")))],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("missing.toml"), "{}", stderr(&out));
    // The text form: one line per setting with its source.
    let out = output(hame(&["config", "--workspace", &wsa], &base, dir.path())).await?;
    let text = stdout(&out);
    assert!(
        text.lines().any(|l| l.starts_with("model ")
            && l.contains("openai:from-ws")
            && l.ends_with(&ws_src)),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    Ok(())
}

#[tokio::test]
async fn a_config_file_configures_the_run() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "list_files", serde_json::json!({})),
        ScriptStep::tool_call("c2", "list_files", serde_json::json!({})),
    ]);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    // Model, base URL and the step limit come from the workspace's file alone.
    fs::write(
        ws.join("hame.toml"),
        format!(
            "model = \"openai:from-file\"\nbase_url = \"{}\"\n[limits]\nmax_iterations = 1\n",
            server.base_url()
        ),
    )?;
    let state = dir.path().join("state");
    let out = output(hame(
        &["run", "--workspace", &s(&ws), "hi"],
        &[("HAME_STATE_HOME", &s(&state))],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("1"), "{}", stderr(&out));
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].body["model"], "from-file");
    Ok(())
}

#[tokio::test]
async fn an_invalid_config_file_is_exit_2_naming_file_line_and_key() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    fs::write(ws.join("hame.toml"), "model = \"openai:m\"\nmodle = 1\n")?;
    let out = output(hame(
        &["run", "--workspace", &s(&ws), "hi"],
        &[],
        dir.path(),
    ))
    .await?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("{} line 2", s(&ws.join("hame.toml")))),
        "{err}"
    );
    assert!(err.contains("unknown field `modle`"), "{err}");
    Ok(())
}

#[tokio::test]
async fn sessions_and_memory_from_the_command_line() -> TestResult {
    let sc = Scratch::scripted([
        ScriptStep::text("Paris it is."),
        ScriptStep::tool_call("c1", "list_files", serde_json::json!({})),
        ScriptStep::text("Listed."),
    ])
    .await?;
    sc.write("MEMORY.md", "- The user lives in Lyon\n")?;
    sc.write("memory/2026-03-14.md", "- Prefers green tea\n")?;
    for (session, msg) in [("trip", "a capital of France?"), ("work", "list files")] {
        sc.run_ws(&["--session", session], msg).await?;
    }
    let run = |args: Vec<&'static str>| {
        let (sc, state) = (&sc, sc.state());
        async move {
            let mut all: Vec<&str> = args;
            all.extend_from_slice(&["--workspace", &sc.ws_s]);
            output(hame(&all, &[("HAME_STATE_HOME", &state)], sc.path())).await
        }
    };
    // list: most recent first; the default subcommand.
    let out = run(vec!["sessions"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ids: Vec<String> = stdout(&out)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids, ["work", "trip"]);
    assert!(stdout(&out).contains("\t2 messages\ta capital of France?"));
    let out = run(vec!["sessions", "list", "--json"]).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(v[1]["id"], "trip");
    assert_eq!(v[1]["message_count"], 2);
    // show: every record, tool calls and results included.
    let out = run(vec!["sessions", "show", "work"]).await?;
    assert_eq!(
        stdout(&out).lines().take(2).collect::<Vec<_>>(),
        ["#0 user: list files", "#1 assistant: → list_files({})"]
    );
    assert!(stdout(&out).contains("#2 tool: ← "), "{}", stdout(&out));
    let out = run(vec!["sessions", "show", "trip", "--json"]).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    let out = run(vec!["sessions", "show", "nope"]).await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no session nope"), "{}", stderr(&out));
    // search
    let out = run(vec!["sessions", "search", "France"]).await?;
    assert_eq!(
        stdout(&out),
        "trip #0: user: a capital of **France**?\n",
        "{}",
        stderr(&out)
    );
    let out = run(vec!["sessions", "search", "France", "--json"]).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(
        (v[0]["session"].clone(), v[0]["seq"].clone()),
        ("trip".into(), 0.into())
    );
    // memory
    let out = run(vec!["memory"]).await?;
    assert_eq!(
        stdout(&out),
        "== MEMORY.md ==\n- The user lives in Lyon\n== memory/2026-03-14.md ==\n- Prefers green tea\n"
    );
    let out = run(vec!["memory", "search", "tea"]).await?;
    assert_eq!(
        stdout(&out),
        "memory/2026-03-14.md:1: - Prefers green **tea**\n"
    );
    let out = run(vec!["memory", "search", "Lyon", "--json"]).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(
        (v[0]["path"].clone(), v[0]["line"].clone()),
        ("MEMORY.md".into(), 1.into())
    );
    let out = run(vec!["memory", "show", "--json"]).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(v[0]["path"], "MEMORY.md");
    let out = run(vec!["memory", "--no-memory"]).await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("memory is switched off"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

#[tokio::test]
async fn chat_commands_are_never_sent_to_the_model() -> TestResult {
    let sc = Scratch::scripted([
        ScriptStep::text("one"),
        ScriptStep::text("two"),
        ScriptStep::text("three"),
    ])
    .await?;
    let (server, ws) = (&sc.server, &sc.ws);
    // After /compact: the summary (asked for the facts too; this answer has no facts
    // section, so the memory flush follows it), requests without tools, then the message.
    server.set_responder(|r: &hame_test_support::RecordedRequest| {
        if r.body["tools"].as_array().is_some_and(|t| !t.is_empty()) {
            ScriptStep::text("four")
        } else {
            ScriptStep::text("- a summary")
        }
    });
    let (state, base) = (sc.state(), server.base_url());
    let out = chat(
        sc.path(),
        &["--workspace", &sc.ws_s, "--model", "openai:first", "--session", "c1"],
        &[("OPENAI_BASE_URL", &base), ("HAME_STATE_HOME", &state)],
        "/help\nhello \\\nsecond line\n/model\n/model openai:second\nafter switch\n/sessions\n/new c2\nin c2\n/compact\n/etc/hosts is a path\n/bogus\n/quit\nnever sent\n",
    )
    .await?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&out), "one\ntwo\nthree\nfour\n", "{err}");
    // The banner names agent, workspace, model and session.
    let first = err.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!(
            "hame chat · agent hame · workspace {} · model openai:first · session c1",
            s(ws)
        )
    );
    assert!(err.contains("/exit, /quit"), "{err}");
    assert!(err.contains("model openai:first\n"), "{err}");
    assert!(
        err.contains("model openai:second for the next turns"),
        "{err}"
    );
    assert!(err.contains("* c1  "), "{err}");
    assert!(err.contains("new session c2"), "{err}");
    assert!(err.contains("unknown command /bogus"), "{err}");
    let reqs = server.requests();
    let users: Vec<String> = reqs
        .iter()
        .map(|r| {
            r.body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .unwrap_or_default()
        })
        .collect();
    // A continued line is one message; commands never reach the model.
    assert_eq!(users[0], "hello \nsecond line");
    assert_eq!(reqs[0].body["model"], "first");
    assert_eq!(users[1], "after switch");
    assert_eq!(reqs[1].body["model"], "second");
    // /new: the next message starts a new conversation (system + user only).
    assert_eq!(users[2], "in c2");
    assert_eq!(reqs[2].body["messages"].as_array().map(Vec::len), Some(2));
    // /compact: the next turn starts with requests without tools (summary, flush), then
    // the message.
    assert!(reqs.len() > 4, "{err}");
    assert!(reqs[3].body["tools"].as_array().is_none_or(Vec::is_empty));
    assert_eq!(
        users.last().map(String::as_str),
        Some("/etc/hosts is a path")
    );
    let last = reqs.last().map(|r| r.body.to_string()).unwrap_or_default();
    assert!(last.contains("a summary"), "{last}");
    for r in &reqs {
        let body = r.body.to_string();
        assert!(
            !body.contains("/help") && !body.contains("never sent"),
            "{body}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn errors_that_cannot_succeed_fail_at_once_in_one_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let wsa = s(&ws);
    // A refused connection on this machine, a host that does not resolve: no retries.
    for (base, needle) in [
        ("http://127.0.0.1:9/v1", "(connection refused)"),
        ("http://no-such-host.invalid/v1", "cannot resolve the host"),
    ] {
        let started = std::time::Instant::now();
        let out = output(hame(
            &["run", "--workspace", &wsa, "--model", "openai:m", "hi"],
            &[("OPENAI_BASE_URL", base), ("HAME_LOG", "debug")],
            dir.path(),
        ))
        .await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("hame: transport error: "), "{err}");
        assert!(last.contains(needle), "{err}");
        assert!(last.contains("OPENAI_BASE_URL"), "{err}");
        // Said once: no repetition of the cause, no HTTP client internals.
        assert!(!last.contains("error sending request"), "{last}");
        assert!(!err.contains("retrying"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    // A database that refuses the connection: named host and cause, exit 2, at once.
    for args in [
        vec!["--state", "postgres://hame@127.0.0.1:9/hame"],
        vec!["--memory-index", "postgres://hame@127.0.0.1:9/hame"],
        vec!["--state", "mysql://hame@127.0.0.1:9/hame"],
    ] {
        let started = std::time::Instant::now();
        let mut all = vec!["run", "--workspace", &wsa, "--model", "openai:m"];
        all.extend_from_slice(&args);
        all.push("hi");
        let out = output(hame(&all, &[], dir.path())).await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("at 127.0.0.1:9: connection refused"), "{err}");
        assert!(!err.contains("pool timed out"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    Ok(())
}

#[tokio::test]
async fn a_wrong_database_password_is_named() -> TestResult {
    let Some(url) = super::common::service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    let Some((head, tail)) = url.rsplit_once('@') else {
        return Err(format!("no credentials in {url}").into());
    };
    let user = head
        .split("://")
        .nth(1)
        .unwrap_or("")
        .split(':')
        .next()
        .unwrap_or("");
    let bad = format!("postgres://{user}:wrong-password@{tail}");
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    for flag in ["--state", "--memory-index"] {
        let out = output(hame(
            &[
                "run",
                "--workspace",
                &s(&ws),
                "--model",
                "openai:m",
                flag,
                &bad,
                "hi",
            ],
            &[],
            dir.path(),
        ))
        .await?;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("password authentication failed"), "{err}");
        assert!(!err.contains("wrong-password"), "{err}");
    }
    Ok(())
}

#[tokio::test]
async fn replay_reruns_a_session_and_reports_the_first_divergence() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "read_file",
            serde_json::json!({"file_path": "notes.md"}),
        ),
        ScriptStep::text("The notes say hello."),
        ScriptStep::text("Second turn."),
    ]);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    fs::write(ws.join("notes.md"), "hello\n")?;
    let wsa = s(&ws);
    let state = s(&dir.path().join("state"));
    for msg in ["read my notes", "and again"] {
        let out = output(hame(
            &[
                "run",
                "--workspace",
                &wsa,
                "--model",
                "openai:m",
                "--session",
                "rec",
                msg,
            ],
            &[
                ("OPENAI_BASE_URL", &server.base_url()),
                ("HAME_STATE_HOME", &state),
            ],
            dir.path(),
        ))
        .await?;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let requests_before = server.requests().len();
    // No model is needed: the answers come from the log.
    let replay = || {
        output(hame(
            &["replay", "rec", "--workspace", &wsa],
            &[("HAME_STATE_HOME", &state)],
            dir.path(),
        ))
    };
    let out = replay().await?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        stdout(&out),
        "identical: 6 records of session rec replayed\n"
    );
    assert_eq!(server.requests().len(), requests_before);
    // The file the tool reads changed: the tool result differs at record #2.
    fs::write(ws.join("notes.md"), "goodbye\n")?;
    let out = replay().await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("first divergence at record #2:\n"),
        "{text}"
    );
    assert!(
        text.contains("recorded: tool:  | result c1: ") && text.contains("hello"),
        "{text}"
    );
    assert!(
        text.contains("replayed: tool:  | result c1: ") && text.contains("goodbye"),
        "{text}"
    );
    let out = output(hame(
        &["replay", "rec", "--workspace", &wsa, "--json"],
        &[("HAME_STATE_HOME", &state)],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(
        (v["identical"].clone(), v["divergence"]["record"].clone()),
        (false.into(), 2.into())
    );
    // An unknown session is exit 2.
    let out = output(hame(
        &["replay", "nope", "--workspace", &wsa],
        &[("HAME_STATE_HOME", &state)],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    Ok(())
}

/// The README's five-minute tour, step by step, against the scripted server's demo script.
#[tokio::test]
async fn the_readme_tour_works_offline() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.set_responder(hame_test_support::demo_reply);
    let dir = tempfile::tempdir()?;
    let base = server.base_url();
    let env = [
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_KEY", "scripted"),
    ];
    let step = |args: &[&str]| output(hame(args, &env, dir.path()));
    let out = step(&["init", "ws"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let toml = dir.path().join("ws/hame.toml");
    let mut text = fs::read_to_string(&toml)?;
    text.push_str("model = \"openai:demo\"\n");
    fs::write(&toml, text)?;
    let out = step(&["run", "--workspace", "ws", "hi"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("Hello from the scripted model. You said: \"hi\""));
    let out = step(&[
        "run",
        "--workspace",
        "ws",
        "which files are in the workspace?",
    ])
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("The tool returned: /AGENTS.md"),
        "{}",
        stdout(&out)
    );
    assert_eq!(stderr(&out), "");
    let out = step(&["config", "--workspace", "ws"]).await?;
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l.starts_with("model ") && l.ends_with("file ws/hame.toml")),
        "{}",
        stdout(&out)
    );
    let out = step(&["sessions", "--workspace", "ws"]).await?;
    assert!(stdout(&out).starts_with("default\t"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("\t6 messages\thi\n"),
        "{}",
        stdout(&out)
    );
    let out = step(&["sessions", "search", "files", "--workspace", "ws"]).await?;
    assert!(
        stdout(&out).contains("default #2: user: which **files**"),
        "{}",
        stdout(&out)
    );
    let out = step(&["replay", "default", "--workspace", "ws"]).await?;
    assert_eq!(
        stdout(&out),
        "identical: 6 records of session default replayed\n"
    );
    let out = chat(
        dir.path(),
        &["--workspace", "ws"],
        &env,
        "hello\n/help\n/sessions\n/exit\n",
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("You said: \"hello\""),
        "{}",
        stdout(&out)
    );
    Ok(())
}

/// `--context-window` (issue #16: the CLI could not declare a window): the compaction
/// trigger follows the declared window, not the model's (128,000 for an unknown model).
#[tokio::test]
async fn a_declared_context_window_drives_compaction() -> TestResult {
    let summary = ScriptStep::text(
        "## Intent\nTest.\n## Progress\nNone\n## Artifacts\nNone\n## Next steps\nNone",
    )
    .when_system("You write the working summary");
    let facts = ScriptStep::text("NO_REPLY").when_system("You extract durable facts");
    let replies = [ScriptStep::text("one"), ScriptStep::text("two")];
    let steps = std::iter::once(facts)
        .chain(std::iter::repeat_n(summary, 4))
        .chain(replies);
    let sc = Scratch::scripted(steps).await?;
    let (state, base) = (sc.state(), sc.server.base_url());
    let key = [("OPENAI_API_KEY", "scripted")];
    let env = [
        ("HAME_STATE_HOME", state.as_str()),
        ("OPENAI_BASE_URL", base.as_str()),
        key[0],
    ];
    let window = |size: &'static str| sc.ws_args(&["--context-window", size]);
    let v = config_json(sc.path(), &window("12000"), &env).await?;
    assert_eq!(
        setting(&v, "limits.context_window"),
        (12000.into(), "flag --context-window".into())
    );
    // ~5,000 tokens per message: the second call is past 80 % of 12,000 (and far below
    // the model's own 128,000), the first is not.
    let long = "plenty of words here ".repeat(950);
    for (i, reply) in ["one", "two"].iter().enumerate() {
        let message = format!("{i}: {long}");
        let out = sc.run_code(0, &window("12000"), &message, &key).await?;
        assert_eq!(stdout(&out).trim(), *reply);
    }
    let summaries = sc
        .server
        .requests()
        .iter()
        .filter(|r| r.system_text().contains("You write the working summary"))
        .count();
    // The second call compacted the first, and the summariser's input budget (half the
    // declared window) split the transcript into parts and a merge.
    assert!(summaries >= 2, "{summaries} summary requests");
    // A window too small to hold anything is refused before anything runs.
    sc.run_code(2, &window("10"), "hi", &key).await?;
    Ok(())
}

/// The token economy of the default tool set: the rarely used tools are deferred behind
/// `tool_search` (a call loads them for the session), `--all-tools` offers everything.
#[tokio::test]
async fn rarely_used_tools_are_offered_on_demand() -> TestResult {
    let sc = Scratch::new().await?;
    let default = super::common::tools_offered(sc.path(), &sc.ws_args(&[])).await?;
    let offered = "agent_spawn edit_file execute glob_files grep_files list_files \
                   memory_search read_file todo_write tool_search write_file";
    assert_eq!(default, offered.split_whitespace().collect::<Vec<_>>());
    let all = super::common::tools_offered(sc.path(), &sc.ws_args(&["--all-tools"])).await?;
    for t in [
        "session_history",
        "task_output",
        "plan_enter",
        "memory_save",
    ] {
        assert!(all.contains(&t.to_owned()), "{t} in {all:?}");
    }
    assert!(!all.contains(&"tool_search".to_owned()), "{all:?}");

    // tool_search loads a group; the session keeps it for the next `hame run`.
    let server = &sc.server;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "tool_search",
            serde_json::json!({"query": "memory_save"}),
        ),
        ScriptStep::tool_call(
            "c2",
            "memory_save",
            serde_json::json!({"fact": "The user prefers tea."}),
        ),
        ScriptStep::text("Noted."),
        ScriptStep::text("Still here."),
    ]);
    let session = ["--session", "t"];
    let out = sc.run_ws(&session, "remember that I prefer tea").await?;
    assert_eq!(stdout(&out), "Noted.\n");
    let out = sc.run_ws(&session, "hi").await?;
    assert_eq!(stdout(&out), "Still here.\n");
    let reqs = server.requests();
    let names = |i: usize| super::common::tool_names(&reqs[i].body);
    assert!(!names(0).contains(&"memory_save".to_owned()));
    for i in 1..4 {
        assert!(
            names(i).contains(&"memory_save".to_owned()),
            "request {i}: {:?}",
            names(i)
        );
        assert!(
            names(i).contains(&"memory_get".to_owned()),
            "the group: {:?}",
            names(i)
        );
    }
    let results = sc.results();
    assert!(results[0].contains("memory_save"), "{}", results[0]);
    assert!(!results[1].contains("unknown_tool"), "{}", results[1]);
    Ok(())
}
