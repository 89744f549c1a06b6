//! `hame mcp serve` (issue 35, item 2): the official Python SDK's client (`mcp`) lists and
//! calls it over stdio and over streamable HTTP, and a second hame uses the first as an MCP
//! server from its `tools.json`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{
    KillOnDrop, bin, run_with, start_hame, stderr, stdout, texts_of_role, tool_results,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn client_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

fn python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("HAME_TEST_MCP_PYTHON")
        && !p.trim().is_empty()
    {
        return Some(PathBuf::from(p));
    }
    super::common::python_venv("mcp-venv", "mcp==2.3.0", "mcp.server.mcpserver")
}

/// Runs the Python client with `args`; its stdout is one JSON object.
async fn client(py: &Path, args: Vec<String>) -> Result<Value, Box<dyn std::error::Error>> {
    let py = py.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py)
            .arg(client_py())
            .args(args)
            .stdin(Stdio::null())
            .output()
    })
    .await??;
    if !out.status.success() {
        return Err(format!(
            "the MCP client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The model's script for the client's two asks; the second must see the first.
fn script(server: &ScriptedServer) {
    server.push_all([ScriptStep::text("reply one"), ScriptStep::text("reply two")]);
}

/// A skill in the workspace `ws`: the server's one prompt.
fn skill(ws: &Path) -> std::io::Result<()> {
    fs::create_dir_all(ws.join("skills/release-notes"))?;
    fs::write(
        ws.join("skills/release-notes/SKILL.md"),
        "---\ndescription: Writes release notes.\n---\nRELEASE-NOTES-BODY: list the changes.\n",
    )
}

/// What both transports must show: the workspace's skill as the one prompt; one `ask` tool, two turns in one session, clear
/// errors for hostile or unknown arguments and tools.
fn check_exchange(out: &Value, server: &ScriptedServer, user: Option<&str>) {
    assert_eq!(out["server"], "hame");
    let tools = out["tools"].as_array().cloned().unwrap_or_default();
    assert_eq!(tools.len(), 1, "{tools:?}");
    assert_eq!(tools[0]["name"], "ask");
    assert_eq!(tools[0]["schema"]["required"], json!(["message"]));
    assert_eq!(
        out["prompts"],
        json!([{"name": "release-notes", "description": "Writes release notes."}])
    );
    let prompt = out["prompt"][0].as_str().unwrap_or_default();
    assert!(prompt.contains("RELEASE-NOTES-BODY"), "{prompt}");
    assert!(
        out["unknown_prompt"]
            .as_str()
            .unwrap_or_default()
            .contains("no skill named `no-such-skill`"),
        "{}",
        out["unknown_prompt"]
    );
    let first = &out["first"];
    assert_eq!(first["is_error"], false, "{first}");
    assert_eq!(first["texts"][0], "reply one");
    let session = first["structured"]["session"].as_str().unwrap_or_default();
    assert!(session.starts_with("mcp-"), "{first}");
    assert!(
        first["texts"][1]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("session: {session}")),
        "{first}"
    );
    assert_eq!(first["structured"]["user"], json!(user));
    let second = &out["second"];
    assert_eq!(second["texts"], json!(["reply two"]), "{second}");
    assert_eq!(second["structured"]["session"], session);
    // The second turn continued the first's conversation.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let users = texts_of_role(&reqs[1].body, "user");
    assert!(users.iter().any(|u| u.contains("first")), "{users:?}");
    let said = texts_of_role(&reqs[1].body, "assistant");
    assert!(said.iter().any(|a| a == "reply one"), "{said:?}");
    // Hostile arguments are refused before anything runs.
    assert_eq!(out["bad_session"]["is_error"], true);
    assert!(
        out["bad_session"]["texts"][0]
            .as_str()
            .unwrap_or_default()
            .contains("session id"),
        "{}",
        out["bad_session"]
    );
    assert_eq!(
        out["extra_argument"]["texts"][0],
        "unknown argument `model`: `ask` takes `message` and an optional `session`"
    );
    assert!(
        out["unknown_tool"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown tool `nope`"),
        "{}",
        out["unknown_tool"]
    );
}

#[tokio::test]
async fn the_python_client_asks_over_stdio() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    skill(&ws)?;
    let server = ScriptedServer::start().await?;
    script(&server);
    let started = Instant::now();
    let args: Vec<String> = [
        "stdio",
        bin(),
        "mcp",
        "serve",
        "--model",
        "openai:m",
        "--no-memory",
        "--base-url",
        &server.base_url(),
        "--workspace",
        &ws.to_string_lossy(),
        "--state",
        &dir.path().join("state").to_string_lossy(),
        "--user",
        "carol",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = client(&py, args).await?;
    eprintln!("stdio: client run {:?}", started.elapsed());
    check_exchange(&out, &server, Some("carol"));
    // The turns are in the session log like any other.
    let logs = dir.path().join("state");
    assert!(logs.exists(), "no state written under {}", logs.display());
    Ok(())
}

/// A running `hame mcp serve --listen`; killed when dropped.
struct Listening {
    _child: KillOnDrop,
    url: String,
}

fn listen(
    dir: &Path,
    model: &str,
    extra: &[&str],
) -> Result<Listening, Box<dyn std::error::Error>> {
    let ws = dir.join("ws");
    fs::create_dir_all(&ws)?;
    skill(&ws)?;
    let command = ["mcp", "serve", "--listen", "127.0.0.1:0"];
    let (child, line) = start_hame(dir, model, &command, extra, &[], Stdio::null())?;
    // "listening on http://ADDR (MCP at http://ADDR/mcp)"
    let url = line
        .trim()
        .rsplit_once("MCP at ")
        .map(|(_, u)| u.trim_end_matches(')').to_owned())
        .ok_or_else(|| format!("unexpected first line: {line:?}"))?;
    Ok(Listening { _child: child, url })
}

#[tokio::test]
async fn the_python_client_asks_over_http_as_the_tokens_user() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let dir = tempfile::tempdir()?;
    let auth = dir.path().join("auth.json");
    fs::write(
        &auth,
        json!({"tokens": {"tok-alice": {"user": "alice"}}}).to_string(),
    )?;
    let server = ScriptedServer::start().await?;
    script(&server);
    let hame = listen(
        dir.path(),
        &server.base_url(),
        &["--auth", &auth.to_string_lossy()],
    )?;
    // No token, a wrong token: 401 before any MCP message is read.
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"}}});
    for token in [None, Some("tok-mallory")] {
        let mut req = http
            .post(&hame.url)
            .header("accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        assert_eq!(req.send().await?.status(), 401, "{token:?}");
    }
    let started = Instant::now();
    let out = client(
        &py,
        vec!["http".into(), hame.url.clone(), "tok-alice".into()],
    )
    .await?;
    eprintln!("http: client run {:?}", started.elapsed());
    check_exchange(&out, &server, Some("alice"));
    Ok(())
}

#[tokio::test]
async fn a_second_hame_delegates_to_the_first_through_tools_json() -> TestResult {
    let dir = tempfile::tempdir()?;
    let inner = dir.path().join("inner");
    let outer = dir.path().join("outer");
    fs::create_dir_all(&inner)?;
    fs::create_dir_all(&outer)?;
    fs::write(inner.join("AGENTS.md"), "You are INNER-7.\n")?;
    fs::write(outer.join("AGENTS.md"), "You are OUTER-3.\n")?;
    let server = ScriptedServer::start().await?;
    fs::write(
        outer.join("tools.json"),
        json!({"mcpServers": {"peer": {
            "command": bin(),
            "args": ["mcp", "serve", "--model", "openai:m", "--no-memory",
                     "--base-url", server.base_url(),
                     "--workspace", inner, "--state", dir.path().join("inner-state")]
        }}})
        .to_string(),
    )?;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "mcp__peer__ask",
            json!({"message": "what is the answer?"}),
        )
        .when_system("OUTER-3"),
        ScriptStep::text("the inner answer is 42").when_system("INNER-7"),
        ScriptStep::text("the peer says 42").when_system("OUTER-3"),
    ]);
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", &outer.to_string_lossy(), "--no-memory"],
        "ask the peer",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "the peer says 42\n");
    let reqs = server.requests();
    let inner_req = reqs
        .iter()
        .find(|r| super::common::system_of(&r.body).contains("INNER-7"))
        .ok_or("the inner hame never asked the model")?;
    let asked = texts_of_role(&inner_req.body, "user");
    assert!(
        asked.iter().any(|u| u.contains("what is the answer?")),
        "{asked:?}"
    );
    let results = tool_results(&server);
    assert!(
        results[0].starts_with("the inner answer is 42\n(session: mcp-"),
        "{results:?}"
    );
    Ok(())
}
