//! `hame serve`, black-box: the binary on 127.0.0.1 against the scripted model server,
//! driven with reqwest (JSON, SSE with ids and replay, bearer auth, the turn gate, 429,
//! SIGTERM drain, approvals, chat completions) and the official `openai` Python SDK (a venv
//! from PyPI); the console in headless Chromium is `console.rs`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{KillOnDrop, Scratch, bin, start_hame, tool_names};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A running `hame serve`; killed when dropped.
pub(super) struct Serve {
    child: KillOnDrop,
    url: String,
    stderr: PathBuf,
}

impl Serve {
    /// Starts `hame serve --listen 127.0.0.1:0 --model openai:m --workspace dir/ws <args>`
    /// and waits for its `listening on http://…` line.
    pub(super) fn start(
        dir: &Path,
        model: &str,
        args: &[&str],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_env(dir, model, args, &[])
    }

    /// [`Serve::start`] with more environment variables.
    pub(super) fn start_env(
        dir: &Path,
        model: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_named(dir, &std::process::id().to_string(), model, args, env)
    }

    /// [`Serve::start_env`] with its stderr in `dir/serve-<name>.err`, so that several
    /// replicas can share one directory (one workspace, one state home).
    pub(super) fn start_named(
        dir: &Path,
        name: &str,
        model: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let stderr = dir.join(format!("serve-{name}.err"));
        let command = ["serve", "--listen", "127.0.0.1:0"];
        let out = std::fs::File::create(&stderr)?.into();
        let (child, line) = start_hame(dir, model, &command, args, env, out)?;
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| {
                format!(
                    "unexpected first line {line:?}; stderr: {}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            })?
            .to_owned();
        Ok(Self { child, url, stderr })
    }

    /// [`Serve::start`] with `--auth` and an auth file of these `tokens`
    /// (`{"<token>": {"user", "agents"?}}`).
    pub(super) fn start_with_tokens(
        dir: &Path,
        model: &str,
        tokens: Value,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let auth = dir.join("auth.json");
        std::fs::write(&auth, json!({ "tokens": tokens }).to_string())?;
        Self::start(dir, model, &["--auth", auth.to_str().ok_or("path")?])
    }

    pub(super) fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash would.
    pub(super) fn kill(&mut self) {
        self.child.kill();
    }

    pub(super) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then waits (up to 20 s) for the exit: the process's exit code.
    pub(super) async fn stop(mut self) -> Result<Option<i32>, Box<dyn std::error::Error>> {
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()?;
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s.code());
            }
            if Instant::now() > deadline {
                return Err(format!("hame serve did not exit; stderr: {}", self.stderr()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One serve test's set-up: a [`Scratch`] (a temporary directory and a scripted model)
/// with `hame serve` started on it. The server stops before the directory goes.
pub(super) struct Served {
    /// The running `hame serve` (dropped first).
    pub(super) serve: Serve,
    /// Its directory (the cwd, HOME and `ws/`) and the scripted model it calls.
    pub(super) s: Scratch,
}

impl Served {
    /// `hame serve` (as [`Serve::start`], no more arguments) against a model answering
    /// `steps`.
    pub(super) async fn start(
        steps: impl IntoIterator<Item = ScriptStep>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let s = Scratch::scripted(steps).await?;
        let serve = Serve::start(s.path(), &s.server.base_url(), &[])?;
        Ok(Self { serve, s })
    }

    /// The scripted model (its recorded requests).
    pub(super) fn model(&self) -> &ScriptedServer {
        &self.s.server
    }

    /// The temporary directory.
    pub(super) fn path(&self) -> &Path {
        self.s.path()
    }

    /// The URL of `path` on the server.
    pub(super) fn at(&self, path: &str) -> String {
        self.serve.at(path)
    }
}

/// The workspace `dir/ws`, its `tools.json` asking for an approval before every
/// `write_file` call.
pub(super) fn ask_before_write_file(dir: &Path) -> std::io::Result<PathBuf> {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws)?;
    let tools = json!({"permissions": {"ask": ["write_file"]}});
    std::fs::write(ws.join("tools.json"), tools.to_string())?;
    Ok(ws)
}

/// One parsed SSE event.
#[derive(Debug, Clone)]
pub(super) struct Sse {
    pub(super) id: Option<u64>,
    pub(super) event: String,
    pub(super) data: Value,
}

pub(super) fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut id = None;
            let mut event = "message".to_owned();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                }
            }
            if data.is_empty() {
                return None;
            }
            let data = data.join("\n");
            Some(Sse {
                id,
                event,
                data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
            })
        })
        .collect()
}

/// Waits (bounded) until `cond` holds.
pub(super) async fn until(what: &str, mut cond: impl FnMut() -> bool) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The value of a metric line `name{labels} value` of `/metrics`.
pub(super) async fn metric(serve: &Serve, series: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let text = client()
        .get(serve.at("/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .map(|v| v.trim().parse().unwrap_or(-1.0))
        })
        .unwrap_or(0.0))
}

pub(super) fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post_sse(url: &str, body: Value) -> Result<Vec<Sse>, Box<dyn std::error::Error>> {
    let resp = client()
        .post(url)
        .header("accept", "text/event-stream")
        .json(&body)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    Ok(parse_sse(&resp.text().await?))
}

fn names(events: &[Sse]) -> Vec<String> {
    events.iter().map(|e| e.event.clone()).collect()
}

pub(super) fn ws_log(dir: &Path, user: Option<&str>, session: &str) -> Vec<Value> {
    let mut p = dir.join("ws");
    if let Some(u) = user {
        p = p.join(u);
    }
    let p = p.join(format!("agents/hame/sessions/{session}.log.jsonl"));
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub(super) fn texts(log: &[Value]) -> Vec<String> {
    log.iter()
        .map(|r| {
            let text: Vec<&str> = r["message"]["content"]
                .as_array()
                .map(|c| c.iter().filter_map(|b| b["text"].as_str()).collect())
                .unwrap_or_default();
            format!("{}: {}", r["role"].as_str().unwrap_or(""), text.join(""))
        })
        .collect()
}

#[tokio::test]
async fn serve_answers_json_and_sse_with_ids_and_replays_after_an_id() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push_all([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "/notes.txt", "content": "hello"}),
        ),
        ScriptStep::text("I wrote notes.txt."),
        ScriptStep::text("Plain answer."),
    ]);
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    assert_eq!(
        client().get(serve.at("/healthz")).send().await?.status(),
        200
    );

    let events = post_sse(
        &serve.at("/v1/sessions/s1/messages"),
        json!({"message": "write notes"}),
    )
    .await?;
    let kinds = names(&events);
    assert_eq!(kinds.first().map(String::as_str), Some("tool_started"));
    assert_eq!(kinds.get(1).map(String::as_str), Some("tool_finished"));
    assert_eq!(kinds.last().map(String::as_str), Some("finished"));
    assert!(kinds.iter().any(|k| k == "text_delta"), "{kinds:?}");
    let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids.len(), events.len(), "every event has an id");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");
    let finished = &events[events.len() - 1].data;
    assert_eq!(finished["reply"], "I wrote notes.txt.");
    assert_eq!(finished["session"], "s1");
    let deltas: String = events
        .iter()
        .filter(|e| e.event == "text_delta")
        .filter_map(|e| e.data["text"].as_str())
        .collect();
    assert_eq!(deltas, "I wrote notes.txt.");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ws/notes.txt"))?,
        "hello"
    );

    // A stream that dropped after the second event replays the rest, by query or header.
    let replay = client()
        .get(serve.at(&format!("/v1/sessions/s1/events?after={}", ids[1])))
        .send()
        .await?
        .text()
        .await?;
    let replay = parse_sse(&replay);
    assert_eq!(
        replay.iter().filter_map(|e| e.id).collect::<Vec<_>>(),
        ids[2..].to_vec()
    );
    let by_header = client()
        .get(serve.at("/v1/sessions/s1/events"))
        .header("last-event-id", ids[ids.len() - 2].to_string())
        .send()
        .await?
        .text()
        .await?;
    assert_eq!(names(&parse_sse(&by_header)), vec!["finished"]);

    // JSON: the documented object.
    let resp = client()
        .post(serve.at("/v1/sessions/s1/messages"))
        .json(&json!({"message": "again"}))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await?;
    assert_eq!(body["reply"], "Plain answer.");
    assert_eq!(body["session"], "s1");
    assert_eq!(body["user"], Value::Null);
    assert_eq!(body["iterations"], 1);
    assert!(body["usage"]["input_tokens"].as_u64().unwrap_or(0) > 0);

    // The log and the session list over HTTP, as on disk.
    let log: Value = client()
        .get(serve.at("/v1/sessions/s1/messages"))
        .send()
        .await?
        .json()
        .await?;
    let on_disk = ws_log(dir.path(), None, "s1");
    assert_eq!(
        log["messages"].as_array().map(Vec::len),
        Some(on_disk.len())
    );
    let list: Value = client()
        .get(serve.at("/v1/sessions"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(list["sessions"][0]["id"], "s1");
    let tasks: Value = client()
        .get(serve.at("/v1/sessions/s1/tasks"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(tasks["tasks"], json!([]));
    // Tools offered are those of `hame run`.
    let reqs = model.requests();
    assert!(tool_names(&reqs[0].body).contains(&"write_file".to_owned()));
    // Bad input is a 400, an unknown session a 404.
    let bad = client()
        .post(serve.at("/v1/sessions/s1/messages"))
        .body("{")
        .send()
        .await?;
    assert_eq!(bad.status(), 400);
    let missing = client()
        .get(serve.at("/v1/sessions/nope/messages"))
        .send()
        .await?;
    assert_eq!(missing.status(), 404);
    Ok(())
}

#[tokio::test]
async fn serve_with_auth_needs_a_bearer_token_and_the_token_decides_the_user() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.set_responder(|_: &hame_test_support::RecordedRequest| ScriptStep::text("hi there"));
    let serve = Serve::start_with_tokens(
        dir.path(),
        &model.base_url(),
        json!({"tok-alice": {"user": "alice"}, "tok-bob": {"user": "bob"}}),
    )?;
    let c = client();
    assert_eq!(c.get(serve.at("/healthz")).send().await?.status(), 200);
    for path in ["/v1/sessions", "/v1/sessions/s1/messages", "/metrics", "/"] {
        let r = c.get(serve.at(path)).send().await?;
        assert_eq!(r.status(), 401, "{path}");
        let r = c.get(serve.at(path)).bearer_auth("wrong").send().await?;
        assert_eq!(r.status(), 401, "{path} with a wrong token");
    }
    let r = c
        .post(serve.at("/v1/sessions/s1/messages"))
        .json(&json!({"message": "hello"}))
        .send()
        .await?;
    assert_eq!(r.status(), 401);
    // The token decides the user; X-Hame-User cannot override it.
    let r = c
        .post(serve.at("/v1/sessions/s1/messages"))
        .bearer_auth("tok-alice")
        .header("x-hame-user", "bob")
        .json(&json!({"message": "hello"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await?;
    assert_eq!(body["user"], "alice");
    assert_eq!(ws_log(dir.path(), Some("alice"), "s1").len(), 2);
    assert!(ws_log(dir.path(), Some("bob"), "s1").is_empty());
    // Alice sees her session; bob gets 404 for it and does not list it.
    let r = c
        .get(serve.at("/v1/sessions/s1/messages"))
        .bearer_auth("tok-alice")
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let r = c
        .get(serve.at("/v1/sessions/s1/messages"))
        .bearer_auth("tok-bob")
        .send()
        .await?;
    assert_eq!(r.status(), 404);
    let list: Value = c
        .get(serve.at("/v1/sessions"))
        .bearer_auth("tok-bob")
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(list["sessions"], json!([]));
    let events = c
        .get(serve.at("/v1/sessions/s1/events?after=0"))
        .bearer_auth("tok-bob")
        .send()
        .await?
        .text()
        .await?;
    assert!(
        parse_sse(&events).is_empty(),
        "bob replays none of alice's events"
    );
    // The console page takes the token in its address.
    let r = c.get(serve.at("/?token=tok-alice")).send().await?;
    assert_eq!(r.status(), 200);
    Ok(())
}

#[tokio::test]
async fn serve_refuses_a_public_address_without_auth() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = serve_once(dir.path(), &["--listen", "0.0.0.0:0"])?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--auth"), "{err}");
    assert!(out.stdout.is_empty());
    // A broken auth file is a usage error too.
    let bad = dir.path().join("auth.json");
    std::fs::write(&bad, "{\"tokens\": 3}")?;
    let bad = bad.to_str().ok_or("a temp path that is not UTF-8")?;
    let out = serve_once(dir.path(), &["--listen", "127.0.0.1:0", "--auth", bad])?;
    assert_eq!(out.status.code(), Some(2));
    Ok(())
}

/// `hame serve --model openai:m <args>` in `dir` (its home too) with no other environment
/// than `PATH`, for a start that is refused: its output once it exits.
fn serve_once(dir: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    std::process::Command::new(bin())
        .args(["serve", "--model", "openai:m"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
}

#[tokio::test]
async fn serve_runs_turns_of_one_session_in_order_and_sessions_in_parallel() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.set_responder(|req: &hame_test_support::RecordedRequest| {
        let last = req.last_user_text().unwrap_or_default();
        ScriptStep::text(format!("reply to {last}")).with_delay(Duration::from_millis(400))
    });
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let url = serve.at("/v1/sessions/one/messages");
    let c = client();
    let first = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { c.post(url).json(&json!({"message": "first"})).send().await })
    };
    until("the first turn's model request", || {
        model.request_count() >= 1
    })
    .await?;
    let second = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { c.post(url).json(&json!({"message": "second"})).send().await })
    };
    let a: Value = first.await??.json().await?;
    let b: Value = second.await??.json().await?;
    assert_eq!(a["reply"], "reply to first");
    assert_eq!(b["reply"], "reply to second");
    assert_eq!(
        texts(&ws_log(dir.path(), None, "one")),
        vec![
            "user: first",
            "assistant: reply to first",
            "user: second",
            "assistant: reply to second"
        ]
    );

    // 20 sessions at once: in parallel, far less than 20 model delays.
    let started = Instant::now();
    let mut handles = Vec::new();
    for i in 0..20 {
        let c = c.clone();
        let url = serve.at(&format!("/v1/sessions/p{i}/messages"));
        handles.push(tokio::spawn(async move {
            c.post(url)
                .json(&json!({"message": format!("m{i}")}))
                .send()
                .await
        }));
    }
    for (i, h) in handles.into_iter().enumerate() {
        let body: Value = h.await??.json().await?;
        assert_eq!(body["reply"], format!("reply to m{i}"));
        assert_eq!(body["session"], format!("p{i}"));
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(400 * 20 / 2),
        "20 sessions took {took:?}: not parallel"
    );
    Ok(())
}

#[tokio::test]
async fn serve_answers_429_with_retry_after_when_a_session_queue_is_full() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.set_responder(|_: &hame_test_support::RecordedRequest| {
        ScriptStep::text("slow").with_delay(Duration::from_millis(2000))
    });
    let serve = Serve::start(dir.path(), &model.base_url(), &["--max-queue", "1"])?;
    let url = serve.at("/v1/sessions/q/messages");
    let c = client();
    let running = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { c.post(url).json(&json!({"message": "a"})).send().await })
    };
    until("the first turn's model request", || {
        model.request_count() >= 1
    })
    .await?;
    let waiting = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move { c.post(url).json(&json!({"message": "b"})).send().await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&serve, "hame_queue_depth{agent=\"hame\"}").await? < 1.0 {
        assert!(Instant::now() < deadline, "the second turn never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = c.post(&url).json(&json!({"message": "c"})).send().await?;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().get("retry-after").is_some());
    // Another session is not affected.
    let other = c
        .get(serve.at("/v1/sessions/elsewhere/messages"))
        .send()
        .await?;
    assert_eq!(other.status(), 404);
    assert_eq!(running.await??.status(), 200);
    assert_eq!(waiting.await??.status(), 200);
    let metrics = c.get(serve.at("/metrics")).send().await?.text().await?;
    assert!(
        metrics.contains("hame_requests_refused_total{agent=\"hame\",reason=\"queue_full\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("hame_turns_total{agent=\"hame\",outcome=\"finished\"} 2"));
    // Model latency: a histogram, one observation per model request (two turns, one step each).
    assert!(
        metrics.contains("# TYPE hame_model_request_seconds histogram")
            && metrics.contains("hame_model_request_seconds_bucket{agent=\"hame\",le=\"+Inf\"} 2")
            && metrics.contains("hame_model_request_seconds_count{agent=\"hame\"} 2"),
        "{metrics}"
    );
    Ok(())
}

#[tokio::test]
async fn serve_drains_in_flight_turns_on_sigterm_and_exits_0() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push(ScriptStep::text("finished anyway").with_delay(Duration::from_millis(1500)));
    let mut serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let url = serve.at("/v1/sessions/d/messages");
    let inflight = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({"message": "x"}))
            .send()
            .await
    });
    until("the turn's model request", || model.request_count() >= 1).await?;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &serve.pid().to_string()])
        .status()?;
    assert!(killed.success());
    let resp = inflight.await??;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await?;
    assert_eq!(body["reply"], "finished anyway");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = serve.child.try_wait()? {
            break s;
        }
        assert!(Instant::now() < deadline, "hame serve did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "stderr: {}", serve.stderr());
    assert_eq!(
        texts(&ws_log(dir.path(), None, "d")),
        vec!["user: x", "assistant: finished anyway"]
    );
    Ok(())
}

#[tokio::test]
async fn serve_suspends_a_call_for_approval_and_resumes_it_over_http() -> TestResult {
    let dir = tempfile::tempdir()?;
    let ws = ask_before_write_file(dir.path())?;
    let model = ScriptedServer::start().await?;
    model.push_all([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "/out.txt", "content": "approved"}),
        ),
        ScriptStep::text("written"),
        ScriptStep::tool_call(
            "c2",
            "write_file",
            json!({"file_path": "/no.txt", "content": "denied"}),
        ),
        ScriptStep::text("not written"),
    ]);
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let c = client();
    let events = post_sse(
        &serve.at("/v1/sessions/a/messages"),
        json!({"message": "write it"}),
    )
    .await?;
    let last = events.last().ok_or("no events")?;
    assert_eq!(last.event, "approval_needed");
    assert_eq!(last.data["tool"], "write_file");
    let id = last.data["id"].as_str().ok_or("no id")?.to_owned();
    assert!(id.starts_with("ap-"));
    assert!(!ws.join("out.txt").exists());
    let pending: Value = c
        .get(serve.at("/v1/sessions/a/approvals"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(pending["approvals"][0]["id"], id.as_str());
    // A bad decision is a 400, an unknown id a 404.
    let bad = c
        .post(serve.at(&format!("/v1/sessions/a/approvals/{id}")))
        .json(&json!({"decision": "maybe"}))
        .send()
        .await?;
    assert_eq!(bad.status(), 400);
    let unknown = c
        .post(serve.at("/v1/sessions/a/approvals/ap-000000000000"))
        .json(&json!({"decision": "approve"}))
        .send()
        .await?;
    assert_eq!(unknown.status(), 404);
    let r = c
        .post(serve.at(&format!("/v1/sessions/a/approvals/{id}")))
        .json(&json!({"decision": "approve"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await?;
    assert_eq!(body["reply"], "written");
    assert_eq!(std::fs::read_to_string(ws.join("out.txt"))?, "approved");

    // JSON: 202 with the approvals; deny gives the model a denied result.
    let r = c
        .post(serve.at("/v1/sessions/a/messages"))
        .json(&json!({"message": "write another"}))
        .send()
        .await?;
    assert_eq!(r.status(), 202);
    let body: Value = r.json().await?;
    assert_eq!(body["status"], "approval_needed");
    let id = body["approvals"][0]["id"]
        .as_str()
        .ok_or("no id")?
        .to_owned();
    let r = c
        .post(serve.at(&format!("/v1/sessions/a/approvals/{id}")))
        .header("accept", "text/event-stream")
        .json(&json!({"decision": "deny", "reason": "not now"}))
        .send()
        .await?;
    let events = parse_sse(&r.text().await?);
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("finished"));
    assert!(
        events
            .iter()
            .any(|e| e.event == "tool_finished" && e.data["is_error"] == true)
    );
    assert!(!ws.join("no.txt").exists());
    Ok(())
}

#[tokio::test]
async fn serve_speaks_openai_chat_completions() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push_all([
        ScriptStep::text("first reply"),
        ScriptStep::text("streamed reply"),
    ]);
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let c = client();
    let url = serve.at("/v1/chat/completions");
    let wrong = c
        .post(&url)
        .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await?;
    assert_eq!(wrong.status(), 404);
    let body: Value = wrong.json().await?;
    assert_eq!(body["error"]["code"], "model_not_found");
    let r = c
        .post(&url)
        .header("x-hame-session", "oa")
        .json(&json!({"model": "hame", "messages": [
            {"role": "system", "content": "caller instructions"},
            {"role": "user", "content": "hello"}
        ]}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await?;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "hame");
    assert_eq!(body["choices"][0]["message"]["content"], "first reply");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0);
    let r = c
        .post(&url)
        .header("x-hame-session", "oa")
        .json(&json!({"model": "hame", "stream": true, "stream_options": {"include_usage": true}, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "again"}]}
        ]}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let text = r.text().await?;
    let chunks = parse_sse(&text);
    assert_eq!(chunks.last().map(|c| c.data.clone()), Some(json!("[DONE]")));
    let content: String = chunks
        .iter()
        .filter_map(|c| c.data["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "streamed reply");
    assert!(
        chunks
            .iter()
            .any(|c| c.data["usage"]["total_tokens"].as_u64().is_some())
    );
    assert!(
        chunks
            .iter()
            .any(|c| c.data["choices"][0]["finish_reason"] == "stop")
    );
    // Both turns are in the one session.
    assert_eq!(
        texts(&ws_log(dir.path(), None, "oa")),
        vec![
            "user: hello",
            "assistant: first reply",
            "user: again",
            "assistant: streamed reply"
        ]
    );
    Ok(())
}

/// A Python with the `openai` SDK: a venv under the target directory, created once (under
/// a lock). `None` (with a loud SKIPPED line) when impossible; under CI a failure.
pub(super) fn openai_python() -> Option<PathBuf> {
    super::common::python_venv("openai-venv", OPENAI_SDK, "openai")
}

/// The version range of the Python SDK the test runs against.
const OPENAI_SDK: &str = "openai>=1.50,<3";

const OPENAI_CLIENT_PY: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="unused", default_headers={"X-Hame-Session": "sdk"})
r = client.chat.completions.create(model="hame", messages=[{"role": "user", "content": "hello"}])
out = {"text": r.choices[0].message.content, "total": r.usage.total_tokens, "finish": r.choices[0].finish_reason}
parts, usage = [], None
stream = client.chat.completions.create(model="hame", messages=[{"role": "user", "content": "stream"}],
                                        stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage.total_tokens
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
out["streamed"] = "".join(parts)
out["stream_usage"] = usage
try:
    client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    out["wrong_model"] = "accepted"
except Exception as e:
    out["wrong_model"] = type(e).__name__
print(json.dumps(out))
"#;

#[tokio::test]
async fn serve_works_with_the_official_openai_python_sdk() -> TestResult {
    let Some(py) = openai_python() else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push_all([
        ScriptStep::text("sdk reply"),
        ScriptStep::text("sdk stream"),
    ]);
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let script = dir.path().join("client.py");
    std::fs::write(&script, OPENAI_CLIENT_PY)?;
    let base = serve.at("/v1");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py)
            .arg(script)
            .arg(base)
            .output()
    })
    .await??;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(got["text"], "sdk reply");
    assert_eq!(got["finish"], "stop");
    assert!(got["total"].as_u64().unwrap_or(0) > 0);
    assert_eq!(got["streamed"], "sdk stream");
    assert!(got["stream_usage"].as_u64().unwrap_or(0) > 0);
    assert_eq!(got["wrong_model"], "NotFoundError");
    assert_eq!(
        texts(&ws_log(dir.path(), None, "sdk")),
        vec![
            "user: hello",
            "assistant: sdk reply",
            "user: stream",
            "assistant: sdk stream"
        ]
    );
    Ok(())
}

#[tokio::test]
async fn serve_replays_and_follows_a_turn_after_a_stream_dropped_mid_turn() -> TestResult {
    use futures::StreamExt;
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push(
        ScriptStep::text("one two three four five six seven eight")
            .with_chunk_delay(Duration::from_millis(150)),
    );
    let serve = Serve::start(dir.path(), &model.base_url(), &[])?;
    let resp = client()
        .post(serve.at("/v1/sessions/r/messages"))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "talk"}))
        .send()
        .await?;
    // Read until the first complete event, then drop the stream.
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = body.next().await.ok_or("stream ended early")??;
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(body);
    let first = parse_sse(&text);
    let last_id = first.last().and_then(|e| e.id).ok_or("no id")?;
    // Reconnect with Last-Event-ID: the rest of the turn, live, up to `finished`.
    let rest = client()
        .get(serve.at("/v1/sessions/r/events"))
        .header("last-event-id", last_id.to_string())
        .send()
        .await?
        .text()
        .await?;
    let rest = parse_sse(&rest);
    assert_eq!(rest.last().map(|e| e.event.as_str()), Some("finished"));
    assert!(rest.iter().all(|e| e.id.unwrap_or(0) > last_id));
    let ids: Vec<u64> = first
        .iter()
        .chain(rest.iter())
        .filter_map(|e| e.id)
        .collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "no gap, no repeat: {ids:?}"
    );
    let text: String = first
        .iter()
        .chain(rest.iter())
        .filter(|e| e.event == "text_delta")
        .filter_map(|e| e.data["text"].as_str())
        .collect();
    assert_eq!(text, "one two three four five six seven eight");
    Ok(())
}

/// Two replicas on one Redis (shared state and files): the events of a turn on one are
/// replayed by the other with the same ids, and ids keep growing across replicas.
#[tokio::test]
async fn serve_replicas_share_a_sessions_events_through_redis() -> TestResult {
    let Some(redis) = super::common::service("HAME_TEST_REDIS_URL") else {
        return Ok(());
    };
    replicas_share_events(&["--state", redis.as_str(), "--store", redis.as_str()]).await
}

/// The same on PostgreSQL state with `--shared-events state` (one workspace directory on a
/// shared disk); without it (`auto`) each replica keeps its own events: a database write
/// per streamed token is asked for, not implied.
#[tokio::test]
async fn serve_replicas_share_a_sessions_events_through_postgres() -> TestResult {
    let Some(pg) = super::common::service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    replicas_share_events(&["--state", pg.as_str(), "--shared-events", "state"]).await?;

    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push(ScriptStep::text("kept on A"));
    let shared = ["--state", pg.as_str()];
    let a = Serve::start_named(dir.path(), "a", &model.base_url(), &shared, &[])?;
    let b = Serve::start_named(dir.path(), "b", &model.base_url(), &shared, &[])?;
    let session = unique_session("own")?;
    let on_a = post_sse(
        &a.at(&format!("/v1/sessions/{session}/messages")),
        json!({"message": "hi"}),
    )
    .await?;
    assert_eq!(names(&on_a).last().map(String::as_str), Some("finished"));
    let on_b = client()
        .get(b.at(&format!("/v1/sessions/{session}/events?after=0")))
        .send()
        .await?
        .text()
        .await?;
    assert!(parse_sse(&on_b).is_empty(), "{on_b}");
    Ok(())
}

/// The same on MySQL / MariaDB, named by URL (`--shared-events mysql://…`).
#[tokio::test]
async fn serve_replicas_share_a_sessions_events_through_mysql() -> TestResult {
    let Some(mysql) = super::common::service("HAME_TEST_MYSQL_URL") else {
        return Ok(());
    };
    let (state, events) = (tempfile::tempdir()?, mysql.as_str());
    let state = state.path().join("state");
    let state = state.to_str().ok_or("a temp path that is not UTF-8")?;
    replicas_share_events(&["--state", state, "--shared-events", events]).await
}

/// `--shared-events state` on a state that cannot hold events, or a value that is none of
/// the choices: exit 2 with one line that says what to pass.
#[tokio::test]
async fn serve_refuses_shared_events_it_cannot_keep() -> TestResult {
    let dir = tempfile::tempdir()?;
    for (value, says) in [
        (
            "state",
            "--shared-events state needs a Redis, PostgreSQL or MySQL state store",
        ),
        (
            "s3://bucket",
            "is not auto, state, off or a redis://, postgres:// or mysql:// URL",
        ),
    ] {
        let out = serve_once(
            dir.path(),
            &["--listen", "127.0.0.1:0", "--shared-events", value],
        )?;
        assert_eq!(out.status.code(), Some(2), "{value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{value}: {err}");
        assert!(out.stdout.is_empty());
    }
    Ok(())
}

/// A session id no earlier run of a test on a shared store has used.
fn unique_session(prefix: &str) -> Result<String, std::time::SystemTimeError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    Ok(format!("{prefix}-{}-{nanos}", std::process::id()))
}

/// Two `hame serve` replicas with `shared` arguments, in one directory (one workspace): a
/// turn's events on one are replayed by the other with the same ids, ids keep growing
/// across them, and a turn running on one is followed from the other.
async fn replicas_share_events(shared: &[&str]) -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push_all([ScriptStep::text("from A"), ScriptStep::text("from B")]);
    let a = Serve::start_named(dir.path(), "a", &model.base_url(), shared, &[])?;
    let b = Serve::start_named(dir.path(), "b", &model.base_url(), shared, &[])?;
    let session = unique_session("rep")?;
    let on_a = post_sse(
        &a.at(&format!("/v1/sessions/{session}/messages")),
        json!({"message": "hi"}),
    )
    .await?;
    assert_eq!(
        names(&on_a).last().map(String::as_str),
        Some("finished"),
        "{on_a:?}"
    );
    let replay = |serve: &Serve, after: u64| {
        let url = serve.at(&format!("/v1/sessions/{session}/events?after={after}"));
        async move {
            let text = client().get(url).send().await?.text().await?;
            Ok::<_, Box<dyn std::error::Error>>(parse_sse(&text))
        }
    };
    let on_b = replay(&b, 0).await?;
    let ids = |evs: &[Sse]| evs.iter().map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(ids(&on_b), ids(&on_a), "B replays A's events: {on_b:?}");
    assert_eq!(names(&on_b), names(&on_a));
    assert_eq!(
        on_b.last().map(|e| e.data["reply"].clone()),
        Some(json!("from A"))
    );
    // A second turn on B: ids continue after A's; A replays it from its last id.
    let last = on_a.last().and_then(|e| e.id).ok_or("no id")?;
    let second = post_sse(
        &b.at(&format!("/v1/sessions/{session}/messages")),
        json!({"message": "again"}),
    )
    .await?;
    assert!(
        second.iter().all(|e| e.id.is_some_and(|id| id > last)),
        "{second:?}"
    );
    let on_a2 = replay(&a, last).await?;
    assert_eq!(ids(&on_a2), ids(&second));
    assert_eq!(
        on_a2.last().map(|e| e.data["reply"].clone()),
        Some(json!("from B"))
    );
    // A turn running on A is followed from B (B polls the shared events until its end).
    model.push(ScriptStep::text("slow words from A").with_chunk_delay(Duration::from_millis(200)));
    let resp = client()
        .post(a.at(&format!("/v1/sessions/{session}/messages")))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "slowly"}))
        .send()
        .await?;
    let mut body = {
        use futures::StreamExt;
        let mut body = resp.bytes_stream();
        let mut text = String::new();
        while !text.contains("\n\n") {
            let chunk = body.next().await.ok_or("stream ended early")??;
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        body
    };
    let last2 = second.last().and_then(|e| e.id).ok_or("no id")?;
    let followed = replay(&b, last2).await?;
    assert_eq!(
        names(&followed).last().map(String::as_str),
        Some("finished"),
        "{followed:?}"
    );
    assert_eq!(
        followed.last().map(|e| e.data["reply"].clone()),
        Some(json!("slow words from A"))
    );
    while futures::StreamExt::next(&mut body).await.is_some() {}
    // The log is shared too: both turns are in the session's messages on either replica.
    let msgs: Value = client()
        .get(a.at(&format!("/v1/sessions/{session}/messages")))
        .send()
        .await?
        .json()
        .await?;
    let text = msgs.to_string();
    assert!(text.contains("from A") && text.contains("from B"), "{text}");
    drop((a, b));
    Ok(())
}
