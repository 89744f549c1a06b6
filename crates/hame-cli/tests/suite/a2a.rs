//! A2A both ways (issue 35, item 1) with the official A2A Python SDK (`a2a-sdk` 0.3, the
//! protocol of `message/send`, `message/stream`, `tasks/get`, `tasks/cancel` and the card
//! at `/.well-known/agent-card.json`): its client drives `hame serve --a2a`, and hame's
//! remote subagents call an agent served by its server (`tests/a2a/*.py`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hame_test_support::{RecordedRequest, ScriptStep};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{Scratch, chat, run_with, service, stderr, stdout, unique_agent};
use super::serve::Serve;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The SDK pinned: the 0.3 line speaks the protocol of the issue's method names.
const A2A_SDK: &str = "a2a-sdk[http-server]==0.3.26 uvicorn==0.38.0";

fn python() -> Option<PathBuf> {
    super::common::python_venv("a2a-venv", A2A_SDK, "a2a.server.apps, uvicorn")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/a2a")
        .join(name)
}

/// The model of the served agent: `execute` of a sleep for a message with `sleep`,
/// else `reply: <message>`.
fn served_model(request: &RecordedRequest) -> ScriptStep {
    let said = request.last_user_text().unwrap_or_default();
    let has_tool_result = request.body.to_string().contains("\"role\":\"tool\"");
    if said.contains("sleep") && !has_tool_result {
        return ScriptStep::tool_call(
            "c-sleep",
            "execute",
            json!({"command": "echo $$ > sleep.pid; exec sleep 30"}),
        );
    }
    ScriptStep::text(format!("reply: {said}"))
}

/// Whether process `pid` is gone (or a zombie nobody waits for any more).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn the_sdk_client_sends_streams_gets_and_cancels() -> TestResult {
    sdk_client_round_trip(None).await
}

#[tokio::test]
async fn the_sdk_client_round_trip_on_postgres() -> TestResult {
    let Some(url) = service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    sdk_client_round_trip(Some(&url)).await
}

#[tokio::test]
async fn the_sdk_client_round_trip_on_mysql() -> TestResult {
    let Some(url) = service("HAME_TEST_MYSQL_URL") else {
        return Ok(());
    };
    sdk_client_round_trip(Some(&url)).await
}

/// The SDK's client against `hame serve --a2a` on the default JSON state, or on `state`
/// (a database URL: the run queue and the sessions there).
async fn sdk_client_round_trip(state: Option<&str>) -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::new().await?;
    s.server.set_responder(served_model);
    s.write(
        "skills/release-notes/SKILL.md",
        "---\ndescription: Writes release notes.\n---\nSteps.\n",
    )?;
    let auth = s.path().join("auth.json");
    std::fs::write(
        &auth,
        r#"{"tokens": {"tok-alice": {"user": "alice"}, "tok-bob": {"user": "bob"}}}"#,
    )?;
    let auth_s = auth.to_string_lossy().into_owned();
    let agent = match state {
        Some(_) => unique_agent(),
        None => "hame".to_owned(),
    };
    let mut args = vec!["--a2a", "--auth", &auth_s, "--agent", &agent];
    if let Some(url) = state {
        args.extend(["--state", url]);
    }
    let serve = Serve::start(s.path(), &s.server.base_url(), &args)?;
    let base = serve.at("");
    let py2 = py.clone();
    let base2 = base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py2)
            .arg(script("client.py"))
            .args([&base2, "tok-alice", "tok-bob"])
            .stdin(Stdio::null())
            .output()
    })
    .await??;
    assert!(
        out.status.success(),
        "client failed: {}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        serve.stderr()
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;

    // The card: its skills are the workspace's, its url the JSON-RPC endpoint.
    assert_eq!(v["card"]["name"], agent.as_str());
    assert_eq!(v["card"]["url"], format!("{base}/a2a"));
    assert_eq!(v["card"]["streaming"], true);
    assert_eq!(v["card"]["skills"], json!(["release-notes"]));
    assert_eq!(v["card"]["protocol"], "0.3.0");

    // message/send blocks until the run's reply; the same context continues the session.
    let send = &v["send"];
    assert_eq!(send["state"], "completed", "{send}");
    assert_eq!(send["artifacts"], json!(["reply: first question"]));
    assert!(send["id"].as_str().unwrap_or_default().starts_with("run-"));
    assert_eq!(send["history"], json!(["user", "agent"]));
    assert_eq!(v["send_again"]["context_id"], send["context_id"]);
    assert_eq!(
        v["send_again"]["artifacts"],
        json!(["reply: second question"])
    );
    let second = s
        .server
        .requests()
        .into_iter()
        .find(|r| r.last_user_text().as_deref() == Some("second question"))
        .ok_or("the second message never reached the model")?;
    assert!(
        second.body.to_string().contains("reply: first question"),
        "the second message's turn saw the first"
    );
    assert_eq!(
        v["get"], *send,
        "tasks/get gives the task message/send gave"
    );

    // message/stream: the task, then its status changes, the reply, the final status.
    assert_eq!(
        v["stream"]["events"],
        json!([
            "task:submitted",
            "status:working",
            "artifact:reply: stream please",
            "status:completed:final"
        ]),
        "{}",
        v["stream"]
    );
    assert_eq!(v["stream"]["task"]["state"], "completed");

    // tasks/cancel stops the run and its tool (the sleep) within 2 s.
    let cancel = &v["cancel"];
    assert_eq!(cancel["before"], "working", "{cancel}");
    assert_eq!(cancel["after"], "canceled", "{cancel}");
    assert!(cancel["seconds"].as_f64().unwrap_or(99.0) < 2.5, "{cancel}");
    let pid: u32 = std::fs::read_to_string(s.ws.join("sleep.pid"))?
        .trim()
        .parse()?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while !gone(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gone(pid),
        "the tool's sleep {pid} still runs after tasks/cancel"
    );
    assert_eq!(
        v["cancel_finished"]["code"], -32002,
        "{}",
        v["cancel_finished"]
    );
    assert_eq!(v["get_hostile"]["code"], -32001, "{}", v["get_hostile"]);

    // Another tenant's task does not exist for bob.
    assert_eq!(v["other_tenant"]["code"], -32001, "{}", v["other_tenant"]);
    assert_eq!(v["other_cancel"]["code"], -32001, "{}", v["other_cancel"]);
    Ok(())
}

/// Hostile JSON-RPC: each a clean JSON-RPC error, never a 5xx.
#[tokio::test]
async fn hostile_requests_are_clean_json_rpc_errors() -> TestResult {
    let s = Scratch::new().await?;
    s.server.set_responder(served_model);
    let other = s.path().join("other");
    std::fs::create_dir_all(&other)?;
    let other_arg = format!("helper={}", other.to_string_lossy());
    let serve = Serve::start(
        s.path(),
        &s.server.base_url(),
        &["--a2a", "--serve-agent", &other_arg],
    )?;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Vec<u8>, user: &str| {
        http.post(serve.at(path))
            .header("content-type", "application/json")
            .header("x-hame-user", user)
            .body(body)
            .send()
    };
    let rpc = |method: &str, params: Value| {
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
            .unwrap_or_default()
    };
    let huge = format!(
        r#"{{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {{"x": "{}"}}}}"#,
        "a".repeat(2 * 1024 * 1024)
    );
    let cases: Vec<(&str, Vec<u8>, i64, u16)> = vec![
        ("not json", b"{oops".to_vec(), -32700, 200),
        ("a batch", b"[]".to_vec(), -32600, 200),
        (
            "no jsonrpc",
            br#"{"id": 1, "method": "tasks/get"}"#.to_vec(),
            -32600,
            200,
        ),
        (
            "unknown method",
            rpc("tasks/explode", json!({})),
            -32601,
            200,
        ),
        (
            "params not an object",
            br#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": [1]}"#.to_vec(),
            -32602,
            200,
        ),
        ("no task id", rpc("tasks/get", json!({})), -32602, 200),
        (
            "a path as task id",
            rpc("tasks/get", json!({"id": "../../etc/passwd"})),
            -32001,
            200,
        ),
        (
            "an unknown task",
            rpc(
                "tasks/cancel",
                json!({"id": "run-00000000000000000000000000000000"}),
            ),
            -32001,
            200,
        ),
        (
            "a user message without parts",
            rpc(
                "message/send",
                json!({"message": {"kind": "message", "role": "user", "messageId": "m"}}),
            ),
            -32602,
            200,
        ),
        (
            "an agent message",
            rpc(
                "message/send",
                json!({"message": {"kind": "message", "role": "agent", "messageId": "m", "parts": [{"kind": "text", "text": "x"}]}}),
            ),
            -32602,
            200,
        ),
        (
            "a file part",
            rpc(
                "message/send",
                json!({"message": {"kind": "message", "role": "user", "messageId": "m", "parts": [{"kind": "file", "file": {"uri": "file:///etc/passwd"}}]}}),
            ),
            -32005,
            200,
        ),
        (
            "a hostile context id",
            rpc(
                "message/send",
                json!({"message": {"kind": "message", "role": "user", "messageId": "m", "contextId": "../x", "parts": [{"kind": "text", "text": "x"}]}}),
            ),
            -32602,
            200,
        ),
        (
            "push notifications",
            rpc("tasks/pushNotificationConfig/set", json!({"taskId": "t"})),
            -32003,
            200,
        ),
    ];
    for (name, body, code, status) in cases {
        let resp = post("/a2a", body, "mallory").await?;
        let got_status = resp.status().as_u16();
        let v: Value = resp.json().await.map_err(|e| format!("{name}: {e}"))?;
        assert_eq!(got_status, status, "{name}: {v}");
        assert_eq!(v["jsonrpc"], "2.0", "{name}: {v}");
        assert_eq!(v["error"]["code"], code, "{name}: {v}");
    }
    // A body over the limit (1 MiB), on a connection of its own: the server closes it.
    let resp = reqwest::Client::new()
        .post(serve.at("/a2a"))
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 413);
    let v: Value = resp.json().await?;
    assert_eq!(v["error"]["code"], -32600, "{v}");
    // A task of alice is not found for mallory; the second agent has its own card and
    // endpoint, and its tasks run with its worker.
    let resp = post(
        "/a2a/helper",
        rpc("message/send", json!({"message": {"kind": "message", "role": "user", "messageId": "m-1", "parts": [{"kind": "text", "text": "to the helper"}]}})),
        "alice",
    )
    .await?;
    let v: Value = resp.json().await?;
    assert_eq!(v["result"]["status"]["state"], "completed", "{v}");
    assert_eq!(
        v["result"]["artifacts"][0]["parts"][0]["text"],
        "reply: to the helper"
    );
    let id = v["result"]["id"].as_str().unwrap_or_default().to_owned();
    let v: Value = post(
        "/a2a/helper",
        rpc("tasks/get", json!({"id": id})),
        "mallory",
    )
    .await?
    .json()
    .await?;
    assert_eq!(v["error"]["code"], -32001, "{v}");
    // tasks/resubscribe of an ended task: its Task, then the stream ends.
    let text = post(
        "/a2a/helper",
        rpc("tasks/resubscribe", json!({"id": id})),
        "alice",
    )
    .await?
    .text()
    .await?;
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    assert_eq!(events.len(), 1, "{text}");
    assert_eq!(events[0]["id"], 7);
    assert_eq!(events[0]["result"]["kind"], "task");
    assert_eq!(events[0]["result"]["status"]["state"], "completed");
    let v: Value = post("/a2a", rpc("tasks/get", json!({"id": id})), "alice")
        .await?
        .json()
        .await?;
    assert_eq!(v["error"]["code"], -32001, "another agent's task: {v}");
    let card: Value = http
        .get(serve.at("/a2a/helper/.well-known/agent-card.json"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(card["name"], "helper");
    assert_eq!(card["url"], serve.at("/a2a/helper"));
    let resp = http
        .get(serve.at("/a2a/nobody/.well-known/agent-card.json"))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 404);
    Ok(())
}

/// The SDK's server, on a free port of 127.0.0.1; killed when dropped.
struct SdkServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for SdkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SdkServer {
    fn start(
        py: &Path,
        dir: &Path,
        token: &str,
        streaming: bool,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let log = dir.join(format!("remote-{streaming}.log"));
        let mut child = std::process::Command::new(py)
            .arg(script("server.py"))
            .arg(&log)
            .args([token, if streaming { "1" } else { "0" }])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("remote.err"))?)
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| {
                format!(
                    "unexpected first line {line:?}: {}",
                    std::fs::read_to_string(dir.join("remote.err")).unwrap_or_default()
                )
            })?;
        Ok(Self { child, port, log })
    }

    /// The tasks it received, one JSON object each.
    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

fn remote_spec(s: &Scratch, port: u16) -> std::io::Result<()> {
    s.write(
        "subagents/remote.md",
        &format!(
            "---\ndescription: A remote echo agent\na2a: http://127.0.0.1:{port}/\na2a_auth_env: A2A_REMOTE_AUTH\ntimeout_seconds: 60\n---\nRuns elsewhere.\n"
        ),
    )
}

const SECRET: &str = "Bearer remote-secret-9c1";

#[tokio::test]
async fn a_remote_subagent_runs_on_the_sdk_server_sync_with_progress() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "remote", "task": "sync task"}),
        ),
        ScriptStep::text("parent done"),
    ])
    .await?;
    let remote = SdkServer::start(&py, s.path(), "remote-secret-9c1", true)?;
    remote_spec(&s, remote.port)?;
    let started = Instant::now();
    let out = chat(
        s.path(),
        &["--model", "openai:m", "--workspace", &s.ws_s],
        &[
            ("OPENAI_BASE_URL", &s.server.base_url()),
            ("HAME_STATE_HOME", &s.path().join("state").to_string_lossy()),
            ("A2A_REMOTE_AUTH", SECRET),
        ],
        "spawn it\n",
    )
    .await?;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("parent done"), "{}", stdout(&out));
    // The child's result came back in the spawn's tool result.
    let reqs = s.server.requests();
    assert_eq!(reqs.len(), 2, "the remote child asks no model");
    let result = super::common::last_tool_result(&reqs[1].body);
    assert!(result.contains("status: completed"), "{result}");
    assert!(result.contains("REMOTE ANSWER to: sync task"), "{result}");
    // Its progress reached the parent's events (shown by chat under the spawn).
    let err = stderr(&out);
    assert!(err.contains("remote working: remote is working"), "{err}");
    // The remote got the task once, with the header; the model never saw the secret.
    let got = remote.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["text"], "sync task");
    assert_eq!(got[0]["auth"], SECRET);
    for r in &reqs {
        assert!(
            !r.body.to_string().contains("remote-secret"),
            "the model saw the secret"
        );
    }
    let records = std::fs::read_dir(s.ws.join("agents/hame/tasks"))?
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
        .collect::<Vec<_>>();
    assert_eq!(records.len(), 1);
    assert!(!records[0].contains("remote-secret"), "{}", records[0]);
    eprintln!("a2a sync spawn round trip: {took:?}");
    Ok(())
}

#[tokio::test]
async fn a_background_remote_result_reaches_the_parent_exactly_once() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "remote", "task": "bg task", "background": true}),
        ),
        ScriptStep::text("started it"),
        ScriptStep::text("seen"),
        ScriptStep::text("again"),
    ])
    .await?;
    // This one does not stream: hame sends message/send and reads the task.
    let remote = SdkServer::start(&py, s.path(), "remote-secret-9c1", false)?;
    remote_spec(&s, remote.port)?;
    let env = [("A2A_REMOTE_AUTH", SECRET)];
    let args = s.ws_args(&[]);
    let out = run_with(s.path(), &s.server.base_url(), &args, "start", &env).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "started it\n");
    for msg in ["next", "third"] {
        let out = run_with(s.path(), &s.server.base_url(), &args, msg, &env).await?;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let reqs = s.server.requests();
    assert_eq!(reqs.len(), 4);
    let count = |r: &RecordedRequest| {
        r.body
            .to_string()
            .matches("REMOTE ANSWER to: bg task")
            .count()
    };
    assert_eq!(count(&reqs[1]), 0, "not before it finished");
    assert_eq!(
        count(&reqs[2]),
        1,
        "pushed once, before the next call's first step"
    );
    assert_eq!(count(&reqs[3]), 1, "once, in the history");
    assert_eq!(remote.received().len(), 1);
    Ok(())
}

#[tokio::test]
async fn cancelling_a_remote_task_cancels_it_on_the_remote() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "remote", "task": "slow task", "background": true}),
        ),
        ScriptStep::text("started"),
    ])
    .await?;
    let remote = SdkServer::start(&py, s.path(), "remote-secret-9c1", true)?;
    remote_spec(&s, remote.port)?;
    // `hame run` waits at most 2 s for its background task, then stops it.
    let mut args = s.ws_args(&["--task-wait", "2"]);
    args.push("--no-memory");
    let out = run_with(
        s.path(),
        &s.server.base_url(),
        &args,
        "start",
        &[("A2A_REMOTE_AUTH", SECRET)],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !remote
        .received()
        .iter()
        .any(|e| e.get("cancelled").is_some())
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = remote.received();
    assert!(
        got.iter().any(|e| e.get("cancelled").is_some()),
        "the remote task was not cancelled: {got:?}"
    );
    Ok(())
}

/// A card read at one origin that sends requests to another does not get the header.
#[tokio::test]
async fn the_auth_header_goes_only_to_the_cards_origin() -> TestResult {
    let Some(py) = python() else { return Ok(()) };
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "remote", "task": "elsewhere"}),
        ),
        ScriptStep::text("parent done"),
    ])
    .await?;
    let remote = SdkServer::start(&py, s.path(), "remote-secret-9c1", true)?;
    // The card is read at localhost; its `url` is http://127.0.0.1:PORT/.
    s.write(
        "subagents/remote.md",
        &format!(
            "---\ndescription: d\na2a: http://localhost:{}/\na2a_auth_env: A2A_REMOTE_AUTH\n---\n",
            remote.port
        ),
    )?;
    let args = s.ws_args(&[]);
    let out = run_with(
        s.path(),
        &s.server.base_url(),
        &args,
        "go",
        &[("A2A_REMOTE_AUTH", SECRET)],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reqs = s.server.requests();
    let result = super::common::last_tool_result(&reqs[1].body);
    assert!(result.contains("another origin"), "{result}");
    assert!(remote.received().is_empty(), "{:?}", remote.received());
    Ok(())
}

/// hame to hame: a remote subagent of one hame is another `hame serve --a2a --auth`, as
/// the token's user; the served side records the task as a run of that user. The token is
/// in a variable with a secret's name (`A2A_PEER_TOKEN`), which the CLI blanks in its own
/// environment once the agent is built: the run still sends it (read from the start-up
/// copy), and it lands in no file of the parent.
#[tokio::test]
async fn one_hame_delegates_to_another_over_a2a() -> TestResult {
    let inner = Scratch::new().await?;
    inner.server.set_responder(served_model);
    let auth = inner.path().join("auth.json");
    std::fs::write(&auth, r#"{"tokens": {"tok-outer": {"user": "outer"}}}"#)?;
    let auth_s = auth.to_string_lossy().into_owned();
    let serve = Serve::start(
        inner.path(),
        &inner.server.base_url(),
        &["--a2a", "--auth", &auth_s],
    )?;
    let outer = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "peer", "task": "hello peer"}),
        ),
        ScriptStep::text("outer done"),
    ])
    .await?;
    outer.write(
        "subagents/peer.md",
        &format!(
            "---\ndescription: Another hame\na2a: {}\na2a_auth_env: A2A_PEER_TOKEN\n---\n",
            serve.at("/.well-known/agent-card.json")
        ),
    )?;
    let args = outer.ws_args(&[]);
    let started = Instant::now();
    let out = run_with(
        outer.path(),
        &outer.server.base_url(),
        &args,
        "go",
        &[("A2A_PEER_TOKEN", "Bearer tok-outer")],
    )
    .await?;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "outer done\n");
    let reqs = outer.server.requests();
    let result = super::common::last_tool_result(&reqs[1].body);
    assert!(result.contains("reply: hello peer"), "{result}");
    // The served side ran it as a run of the token's user.
    let runs = std::process::Command::new(super::common::bin())
        .args(["runs", "list", "--json", "--user", "outer", "--workspace"])
        .arg(&inner.ws)
        .env("HOME", inner.path())
        .env("HAME_STATE_HOME", inner.path().join("state"))
        .current_dir(inner.path())
        .output()?;
    let listed: Value = serde_json::from_slice(&runs.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&runs.stderr)))?;
    let listed = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["status"], "completed", "{listed:?}");
    assert_eq!(listed[0]["reply"], "reply: hello peer", "{listed:?}");
    let leaked = super::common::files_containing(outer.path(), "tok-outer");
    assert!(leaked.is_empty(), "the token is on disk: {leaked:?}");
    eprintln!("hame → hame over A2A, one sync spawn: {took:?}");
    Ok(())
}
