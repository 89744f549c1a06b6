//! MCP servers through `hame run`: a real server written with the official Python SDK
//! (`mcp`, in a venv this suite creates from PyPI once), over stdio and streamable HTTP,
//! with `${VAR}` substitution; a broken server is a warning and the run goes on.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hame_test_support::ScriptStep;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{Scratch, run_with, stderr, stdout, tool_names, tool_results, warnings};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The version of the Python SDK the tests run against.
const MCP_SDK: &str = "mcp==2.3.0";

fn server_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/server.py")
}

/// A Python with the `mcp` SDK: `HAME_TEST_MCP_PYTHON`, else a venv under the target
/// directory, created once (under a lock) with `python3 -m venv` and `pip install`.
/// `None` (with a loud SKIPPED line) when that is impossible; under CI a failure.
pub(super) fn python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("HAME_TEST_MCP_PYTHON")
        && !p.trim().is_empty()
    {
        return Some(PathBuf::from(p));
    }
    super::common::python_venv("mcp-venv", MCP_SDK, "mcp.server.mcpserver")
}

/// Writes the workspace's `tools.json` with one MCP server `py`: the test server run by
/// `python` over stdio, its pid written to `<dir>/server.pid`.
fn stdio_server(s: &Scratch, python: &Path) -> std::io::Result<()> {
    let pidfile = s.path().join("server.pid");
    let config = json!({"mcpServers": {"py": {
        "transport": "stdio",
        "command": python,
        "args": [server_py(), "stdio", pidfile],
    }}});
    s.write("tools.json", &config.to_string())
}

fn alive(pid: u32) -> bool {
    // A zombie has exited already.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

#[tokio::test]
async fn stdio_server_tools_are_offered_and_called_with_env_from_vars() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    let pidfile = dir.path().join("server.pid");
    fs::write(
        ws.join("tools.json"),
        json!({
            "deny": ["mcp__py__head*"],
            "mcpServers": {"py": {
                "transport": "stdio",
                "command": py,
                "args": [server_py(), "stdio", pidfile],
                "env": {"MCP_SECRET": "${HAME_TEST_SECRET}"}
            }}
        })
        .to_string(),
    )?;
    let ws_s = &s.ws_s;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call("c1", "mcp__py__echo", json!({"text": "hello"})),
        ScriptStep::tool_call("c2", "mcp__py__secret", json!({})),
        ScriptStep::tool_call("c3", "mcp__py__fail", json!({"reason": "no"})),
        ScriptStep::tool_call("c4", "mcp__py__header", json!({})),
        ScriptStep::tool_call("c5", "mcp__py__grow", json!({})),
        ScriptStep::tool_call("c6", "mcp__py__grown", json!({})),
        ScriptStep::text("done"),
    ]);
    let started = Instant::now();
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", ws_s],
        "use the server",
        &[("HAME_TEST_SECRET", "s3\"cr}et")],
    )
    .await?;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "done\n");
    // The server's stderr goes to the log, not to the user's terminal.
    assert!(
        !stderr(&out).contains("MCP server starting"),
        "{}",
        stderr(&out)
    );
    let reqs = server.requests();
    let names = tool_names(&reqs[0].body);
    assert!(
        names.contains(&"mcp__py__echo".to_string()) && names.contains(&"read_file".to_string()),
        "{names:?}"
    );
    assert!(
        !names.contains(&"mcp__py__header".to_string()),
        "denied by glob: {names:?}"
    );
    let echo = reqs[0].body["tools"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["function"]["name"] == "mcp__py__echo"))
        .ok_or("no echo")?;
    assert_eq!(
        echo["function"]["description"],
        "Echo the text back, upper-cased."
    );
    assert_eq!(echo["function"]["parameters"]["required"], json!(["text"]));
    let results = tool_results(server);
    assert_eq!(results[0], "HELLO");
    // The server got the value (`${HAME_TEST_SECRET}` in its env) and echoed it; the model
    // sees it redacted: a value a secret-named variable put into tools.json is a secret of
    // the process (ADR 0023).
    assert_eq!(results[1], "secret=[REDACTED]");
    assert!(
        results[2].starts_with("Error [tool_failed]") && results[2].contains("refused: no"),
        "{}",
        results[2]
    );
    assert!(
        results[3].contains("not allowed by tools.json"),
        "{}",
        results[3]
    );
    // notifications/tools/list_changed: the next step offers the new tool.
    assert_eq!(
        (results[4].as_str(), results[5].as_str()),
        ("added", "grown")
    );
    assert!(!tool_names(&reqs[4].body).contains(&"mcp__py__grown".to_string()));
    assert!(tool_names(&reqs[5].body).contains(&"mcp__py__grown".to_string()));
    // One server process for the whole call, killed when hame exits.
    let pid: u32 = fs::read_to_string(&pidfile)?.trim().parse()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the stdio server {pid} outlived hame");
    eprintln!("stdio MCP run: {took:?}");
    Ok(())
}

/// A Python streamable-HTTP server on a free port, killed on drop.
pub(super) struct HttpServer(std::process::Child, pub(super) u16);

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn http_server(py: &Path) -> Result<HttpServer, Box<dyn std::error::Error>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = std::process::Command::new(py)
        .arg(server_py())
        .args(["http", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let server = HttpServer(child, port);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("the HTTP MCP server did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(server)
}

#[tokio::test]
async fn http_server_with_url_and_headers_from_vars() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let http = http_server(&py)?;
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    fs::write(
        ws.join("tools.json"),
        json!({"mcpServers": {"web": {
            "transport": "http",
            "url": "http://127.0.0.1:${HAME_TEST_PORT}/mcp",
            "headers": {"x-hame-test": "${HAME_TEST_SECRET}"}
        }}})
        .to_string(),
    )?;
    let ws_s = &s.ws_s;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call("c1", "mcp__web__header", json!({})),
        ScriptStep::tool_call("c2", "mcp__web__echo", json!({"text": "over http"})),
        ScriptStep::text("done"),
    ]);
    let port = http.1.to_string();
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &["--workspace", ws_s],
        "use the web server",
        &[("HAME_TEST_PORT", &port), ("HAME_TEST_SECRET", "tok-123")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let results = tool_results(server);
    assert_eq!(results, ["header=tok-123", "OVER HTTP"]);
    let names = tool_names(&server.requests()[0].body);
    for t in [
        "mcp__web__echo",
        "mcp__web__fail",
        "mcp__web__header",
        "mcp__web__secret",
    ] {
        assert!(names.contains(&t.to_string()), "{t}: {names:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_broken_server_is_one_warning_and_the_run_goes_on() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::new().await?;
    let ws = &s.ws;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    fs::write(
        ws.join("tools.json"),
        json!({"mcpServers": {
            "missing": {"command": "/nonexistent/mcp-server"},
            "silent": {"command": "sleep", "args": ["30"], "startupTimeout": 1},
            "nothere": {"transport": "http", "url": format!("http://127.0.0.1:{closed}/mcp"), "startupTimeout": 2},
            "good": {"command": py, "args": [server_py()]}
        }})
        .to_string(),
    )?;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call("c1", "mcp__good__echo", json!({"text": "still works"})),
        ScriptStep::tool_call("c2", "mcp__missing__anything", json!({})),
        ScriptStep::text("fine"),
    ]);
    let started = Instant::now();
    let out = s.run_ws(&[], "go").await?;
    let took = started.elapsed();
    assert_eq!(stdout(&out), "fine\n");
    let err = stderr(&out);
    let warnings = warnings(&out);
    assert_eq!(warnings.len(), 3, "one line per broken server: {err}");
    for name in ["missing", "silent", "nothere"] {
        assert!(
            warnings
                .iter()
                .any(|l| l.contains(&format!("mcpServers.{name}"))),
            "{name}: {err}"
        );
    }
    assert!(took < Duration::from_secs(15), "{took:?}");
    let results = tool_results(server);
    assert_eq!(results[0], "STILL WORKS");
    assert!(results[1].contains("unknown_tool"), "{}", results[1]);
    let names = tool_names(&server.requests()[0].body);
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with("mcp__missing") && !n.starts_with("mcp__silent")),
        "{names:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_subagents_tool_allowlist_covers_mcp_tools() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::new().await?;
    stdio_server(&s, &py)?;
    s.write(
        "subagents/reader.md",
        "---\ndescription: Reads\ntools: [read_file]\n---\nYou are READER-11.\n",
    )?;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "reader", "task": "t"}),
        )
        .when_system("Available subagents:"),
        // The child tries an MCP tool it was not given.
        ScriptStep::tool_call("r1", "mcp__py__echo", json!({"text": "x"})).when_system("READER-11"),
        ScriptStep::text("reader done").when_system("READER-11"),
        ScriptStep::text("done").when_system("Available subagents:"),
    ]);
    s.run_ws(&[], "go").await?;
    let reqs = server.requests();
    let names = |r: &hame_test_support::RecordedRequest| tool_names(&r.body);
    let parent = &reqs[0];
    assert!(
        names(parent).iter().any(|n| n == "mcp__py__echo"),
        "{:?}",
        names(parent)
    );
    let child: Vec<_> = reqs
        .iter()
        .filter(|r| super::common::system_of(&r.body).contains("READER-11"))
        .collect();
    assert_eq!(child.len(), 2);
    assert_eq!(names(child[0]), vec!["read_file"]);
    let refused = super::common::last_tool_result(&child[1].body);
    assert!(
        refused.contains("not among this subagent's tools"),
        "{refused}"
    );
    Ok(())
}

#[tokio::test]
async fn plan_mode_runs_read_only_mcp_tools_and_denies_the_others() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::new().await?;
    stdio_server(&s, &py)?;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_calls(vec![
            hame_test_support::ScriptToolCall::new("c1", "mcp__py__echo", &json!({"text": "hi"})),
            hame_test_support::ScriptToolCall::new("c2", "mcp__py__secret", &json!({})),
        ]),
        ScriptStep::text("done"),
    ]);
    s.run_ws(&["--plan"], "go").await?;
    let results = super::common::tool_results(server);
    // `echo` has readOnlyHint: it runs; `secret` has none: denied, naming plan mode.
    assert_eq!(results[0], "HI");
    assert!(
        results[1].contains("permission_denied") && results[1].contains("plan mode"),
        "{results:?}"
    );
    Ok(())
}

/// `hame run` with `tools.json` naming `server` (a 200 s call timeout) as `web`: calls
/// `mcp__web__big` for 17 MiB, then `mcp__web__big` for 1 KiB and `mcp__web__echo`. The tool
/// results and how long the run took.
async fn run_big_result(
    server: serde_json::Value,
) -> Result<(Vec<String>, Duration), Box<dyn std::error::Error>> {
    let s = Scratch::new().await?;
    let ws = &s.ws;
    let mut server = server;
    server["timeout"] = json!(200);
    fs::write(
        ws.join("tools.json"),
        json!({"mcpServers": {"web": server}}).to_string(),
    )?;
    let model = &s.server;
    model.push_all([
        ScriptStep::tool_call("c1", "mcp__web__big", json!({"mib": 17})),
        ScriptStep::tool_call("c2", "mcp__web__big", json!({"mib": 0.001})),
        ScriptStep::tool_call("c3", "mcp__web__echo", json!({"text": "still here"})),
        ScriptStep::text("done"),
    ]);
    let started = Instant::now();
    let out = s.run_ws(&[], "get the big one").await?;
    let took = started.elapsed();
    assert_eq!(stdout(&out), "done\n");
    let results = tool_results(model);
    // The connection is usable afterwards (over HTTP: again).
    assert_eq!(results[1..], ["x".repeat(1048), "STILL HERE".to_owned()]);
    // ~1–4 s here; 10 s at a load of 12.
    assert!(
        took < Duration::from_secs(60),
        "at once, not after the 200 s timeout: {took:?}"
    );
    Ok((results, took))
}

/// A result over the 16 MiB limit of one MCP message (issue #30, item 9) fails its call at
/// once, saying so, instead of waiting for the call's timeout and saying `timeout`; the
/// connection stays usable.
#[tokio::test]
async fn a_result_over_16_mib_fails_at_once_and_says_why() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let (results, took) =
        run_big_result(json!({"transport": "stdio", "command": py, "args": [server_py()]})).await?;
    let refused = &results[0];
    assert!(
        refused.starts_with("Error [tool_failed]")
            && refused.contains("over the 16 MiB limit of one message (16777216 bytes)"),
        "{refused}"
    );
    let bytes: u64 = refused
        .split("result of tools/call big is ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .ok_or("no size in the error")?
        .parse()?;
    // The size of the whole message: the Python SDK sends the text twice, as `content`
    // and as `structuredContent`.
    assert!(
        (2 * (17 << 20)..2 * (17 << 20) + 4096).contains(&bytes),
        "{bytes}"
    );
    eprintln!("17 MiB result refused; the run took {took:?}");
    Ok(())
}

/// The same over streamable HTTP: the SDK's HTTP client refuses an SSE event (or a body)
/// over 16 MiB and closes the connection, so the call fails at once (saying the connection
/// closed, naming the limit as a cause; the SDK's log line says which) instead of waiting
/// for its timeout, and the next call connects again.
#[tokio::test]
async fn an_http_result_over_16_mib_fails_at_once() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let http = http_server(&py)?;
    let url = format!("http://127.0.0.1:{}/mcp", http.1);
    let (results, _) = run_big_result(json!({"transport": "http", "url": url})).await?;
    assert!(
        results[0].starts_with("Error [tool_failed]")
            && results[0].contains("the connection closed before the result arrived")
            && results[0].contains("16 MiB"),
        "{}",
        results[0]
    );
    Ok(())
}

/// Issue 35, item 4: `dot.name` and `dot_name`, and two names that differ only after 64
/// characters, are four tools under four names, each called on its own; each renamed
/// tool is one warning line for the whole run.
#[tokio::test]
async fn colliding_tool_names_stay_distinct_tools() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::new().await?;
    let ws = &s.ws;
    fs::write(
        ws.join("tools.json"),
        json!({"mcpServers": {"rc": {
            "command": py, "args": [server_py()], "env": {"HAME_TEST_MCP_COLLIDE": "1"}
        }}})
        .to_string(),
    )?;
    let long = "a_tool_name_that_goes_on_and_on_past_the_limit_of_64_characters_";
    let tools = [
        "dot.name",
        "dot_name",
        &format!("{long}one"),
        &format!("{long}two"),
    ];
    let names: Vec<String> = tools
        .iter()
        .map(|t| hame::mcp::qualified_name("rc", t))
        .collect();
    let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), 4, "{names:?}");
    let server = &s.server;
    let mut steps: Vec<ScriptStep> = names
        .iter()
        .enumerate()
        .map(|(i, n)| ScriptStep::tool_call(format!("c{i}"), n, json!({})))
        .collect();
    steps.push(ScriptStep::text("done"));
    server.push_all(steps);
    let out = s.run_ws(&[], "call them all").await?;
    let offered = tool_names(&server.requests()[0].body);
    for n in &names {
        assert!(offered.contains(n), "{n}: {offered:?}");
    }
    let expected: Vec<String> = tools.iter().map(|t| format!("I am {t}")).collect();
    assert_eq!(tool_results(server), expected);
    // Three renamed (the dot, the two long ones), each warned once over five steps.
    let renamed: Vec<String> = warnings(&out)
        .into_iter()
        .filter(|w| w.contains("mcp.tool_renamed"))
        .collect();
    assert_eq!(renamed.len(), 3, "{renamed:?}");
    assert!(
        renamed[0].starts_with(&format!(
            "hame: warning: mcp.tool_renamed mcpServers.rc: tool `dot.name` is offered as `{}`",
            names[0]
        )),
        "{renamed:?}"
    );
    Ok(())
}
