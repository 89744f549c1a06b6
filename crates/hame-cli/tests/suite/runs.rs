//! Durable runs, black-box: `hame serve` accepts runs (`POST /v1/sessions/{s}/runs`),
//! workers (`hame serve` itself or `hame worker` processes) drain them from the state
//! store, a SIGKILLed worker's run is taken over by another, a cancel sent to the server
//! stops a run executing in a worker process, and `hame runs` reads and cancels them
//! without a server. On the default JSON state and on real PostgreSQL, MySQL and Redis.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{
    KillOnDrop, backend_tests, hame, output, service, start_hame, stderr, stdout, unique_agent,
};
use super::serve::Serve;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A running `hame worker`; killed when dropped.
struct WorkerProcess {
    child: KillOnDrop,
    stderr: PathBuf,
}

impl WorkerProcess {
    /// Starts `hame worker` on `dir/ws` (the same environment as [`Serve::start`]) and
    /// waits for its first line.
    fn start(
        dir: &Path,
        model: &str,
        args: &[&str],
        name: &str,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_env(dir, model, args, name, &[])
    }

    /// [`WorkerProcess::start`] with more environment variables.
    fn start_env(
        dir: &Path,
        model: &str,
        args: &[&str],
        name: &str,
        env: &[(&str, &str)],
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let stderr = dir.join(format!("worker-{name}.err"));
        let command = ["worker"];
        let out = std::fs::File::create(&stderr)?.into();
        let (child, line) = start_hame(dir, model, &command, args, env, out)?;
        if !line.starts_with("worker ") {
            return Err(format!(
                "unexpected first line {line:?}; stderr: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            )
            .into());
        }
        Ok(Self { child, stderr })
    }

    /// SIGKILL, as a crash would.
    fn kill(&mut self) {
        self.child.kill();
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// A scripted model that answers `done: <last user text>`, after 60 s for a text that
/// starts with `slow`.
async fn slow_model() -> Result<ScriptedServer, Box<dyn std::error::Error>> {
    delayed_model("slow", Duration::from_secs(60)).await
}

/// A scripted model that answers `done: <last user text>`, after `delay` for a text that
/// starts with `prefix`.
async fn delayed_model(
    prefix: &'static str,
    delay: Duration,
) -> Result<ScriptedServer, Box<dyn std::error::Error>> {
    let model = ScriptedServer::start().await?;
    model.set_responder(move |r: &RecordedRequest| {
        let text = r.last_user_text().unwrap_or_default();
        let step = ScriptStep::text(format!("done: {text}"));
        if text.starts_with(prefix) {
            step.with_delay(delay)
        } else {
            step
        }
    });
    Ok(model)
}

/// The scripted model answers every request with `done: <last user text>`.
fn echo(request: &RecordedRequest) -> ScriptStep {
    ScriptStep::text(format!(
        "done: {}",
        request.last_user_text().unwrap_or_default()
    ))
}

async fn submit(
    http: &reqwest::Client,
    s: &Serve,
    user: &str,
    session: &str,
    message: &str,
    key: Option<&str>,
) -> Result<(u16, Value), Box<dyn std::error::Error>> {
    let mut req = http
        .post(s.at(&format!("/v1/sessions/{session}/runs")))
        .header("x-hame-user", user)
        .json(&json!({"message": message}));
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let resp = req.send().await?;
    Ok((resp.status().as_u16(), resp.json().await?))
}

async fn get_run(
    http: &reqwest::Client,
    s: &Serve,
    user: &str,
    id: &str,
) -> Result<(u16, Value), Box<dyn std::error::Error>> {
    let resp = http
        .get(s.at(&format!("/v1/runs/{id}")))
        .header("x-hame-user", user)
        .send()
        .await?;
    Ok((resp.status().as_u16(), resp.json().await?))
}

/// `GET /v1/sessions/{session}/runs` as `user`: the body.
async fn session_runs(
    http: &reqwest::Client,
    s: &Serve,
    user: &str,
    session: &str,
) -> Result<Value, Box<dyn std::error::Error>> {
    Ok(http
        .get(s.at(&format!("/v1/sessions/{session}/runs")))
        .header("x-hame-user", user)
        .send()
        .await?
        .json()
        .await?)
}

/// Polls a run until `done(status)` or `limit`; the last view.
async fn wait_run(
    http: &reqwest::Client,
    s: &Serve,
    user: &str,
    id: &str,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> Result<Value, Box<dyn std::error::Error>> {
    let start = Instant::now();
    loop {
        let (code, run) = get_run(http, s, user, id).await?;
        assert_eq!(code, 200, "{run}");
        if done(run["status"].as_str().unwrap_or("")) || start.elapsed() > limit {
            return Ok(run);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn finished(s: &str) -> bool {
    matches!(
        s,
        "completed" | "unverified" | "failed" | "cancelled" | "waiting_approval"
    )
}

/// Issue #33: a run with `verify` whose check still fails after the gate's extra step ends
/// `unverified`, and `GET /v1/runs/{id}`, the session's run list and `hame runs list|show`
/// show the failing evidence; once the file is fixed, the same run ends `completed`,
/// verified. A bad `verify` is a 400 naming it and makes no run.
async fn an_unverified_run_shows_its_evidence(state: &str) -> TestResult {
    let model = ScriptedServer::start().await?;
    // The model never runs the tests: it answers every request.
    model.set_responder(echo);
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(
        ws.join("hame.toml"),
        "[[verify]]\nname = \"tests\"\ncommand = \"grep -q fine ok.txt\"\n",
    )?;
    std::fs::write(ws.join("ok.txt"), "broken\n")?;
    let agent = unique_agent();
    let common = ["--agent", agent.as_str(), "--state", state];
    let s = Serve::start(dir.path(), &model.base_url(), &common)?;
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(s.at("/v1/sessions/v1/runs"))
            .header("x-hame-user", "u")
            .json(&body)
            .send()
    };

    for (bad, field) in [
        (json!({"message": "m", "verify": ["nope"]}), "`verify`"),
        (
            json!({"message": "m", "verify": ["tests"], "verify_attempts": 0}),
            "`verify_attempts`",
        ),
        (
            json!({"message": "m", "verify_attempts": 2}),
            "`verify_attempts`",
        ),
        (
            json!({"message": "m", "verify": "tests"}),
            "expected a sequence",
        ),
    ] {
        let r = post(bad.clone()).await?;
        assert_eq!(r.status().as_u16(), 400, "{bad}");
        let body: Value = r.json().await?;
        assert!(body.to_string().contains(field), "{bad}: {body}");
    }

    let r = post(json!({"message": "fix it", "verify": ["tests"]})).await?;
    assert_eq!(r.status().as_u16(), 202);
    let id = run_id_of(r).await?;
    let run = wait_run(&http, &s, "u", &id, Duration::from_secs(60), finished).await?;
    assert_eq!(run["status"], "unverified", "{run}; stderr: {}", s.stderr());
    assert!(
        run["reply"]
            .as_str()
            .is_some_and(|r| r.starts_with("done: ")),
        "{run}"
    );
    let v = &run["verification"];
    assert_eq!(v["status"], "unverified", "{run}");
    assert_eq!(v["extra_steps"], 1, "{run}");
    assert_eq!(v["evidence"][0]["check"], "tests", "{run}");
    assert_eq!(v["evidence"][0]["outcome"], "failed", "{run}");
    assert_eq!(v["evidence"][0]["exit_code"], 1, "{run}");
    let evidence_id = v["evidence"][0]["id"].as_str().ok_or("no evidence id")?;
    assert!(evidence_id.starts_with("ev-"), "{run}");
    // The model got one extra step naming the failing check; no error on the run.
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "one answer, one extra step");
    let extra = reqs[1].last_user_text().unwrap_or_default();
    assert!(
        extra.contains("[hame verify]") && extra.contains("tests"),
        "{extra}"
    );
    assert!(run.get("error").is_none(), "{run}");

    let list: Value = session_runs(&http, &s, "u", "v1").await?;
    assert_eq!(list["runs"][0]["status"], "unverified", "{list}");
    assert_eq!(list["runs"][0]["verification"], *v, "{list}");

    let ws_s = ws.to_string_lossy().into_owned();
    let cli = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--workspace", ws_s.as_str(), "--user", "u"]);
        all.extend(common);
        hame(&all, &[], dir.path())
    };
    let out = output(cli(&["runs", "list"])).await?;
    let listed = stdout(&out);
    assert!(
        listed.contains("unverified") && listed.contains("checks: tests failed"),
        "{listed}{}",
        stderr(&out)
    );
    let out = output(cli(&["runs", "show", &id])).await?;
    let shown = stdout(&out);
    assert!(
        shown.contains("status   unverified")
            && shown.contains("unverified after 1 extra step: tests failed")
            && shown.contains(&format!("tests failed (evidence {evidence_id}")),
        "{shown}{}",
        stderr(&out)
    );
    let out = output(cli(&["runs", "show", &id, "--json"])).await?;
    let shown: Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(shown["verification"], *v);

    // Fixed: the next run's check passes and the run completes, verified.
    std::fs::write(ws.join("ok.txt"), "fine\n")?;
    let r = post(json!({"message": "again", "verify": ["tests"], "verify_attempts": 1})).await?;
    let id = run_id_of(r).await?;
    let run = wait_run(&http, &s, "u", &id, Duration::from_secs(60), finished).await?;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["reply"], "done: again");
    assert_eq!(run["verification"]["status"], "verified", "{run}");
    assert_eq!(run["verification"]["evidence"][0]["outcome"], "passed");
    // A run without `verify` carries no verdict.
    let r = post(json!({"message": "plain"})).await?;
    let id = run_id_of(r).await?;
    let run = wait_run(&http, &s, "u", &id, Duration::from_secs(60), finished).await?;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(run.get("verification").is_none(), "{run}");
    Ok(())
}

backend_tests!(an_unverified_run_shows_its_evidence {
    an_unverified_run_shows_its_evidence_on_json_state: json,
    an_unverified_run_shows_its_evidence_on_postgres: "HAME_TEST_POSTGRES_URL",
});

/// The whole surface on the default JSON state, with the worker inside `hame serve`.
#[tokio::test]
async fn runs_are_accepted_executed_listed_and_isolated() -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(echo);
    let dir = tempfile::tempdir()?;
    let s = Serve::start(dir.path(), &model.base_url(), &[])?;
    let http = reqwest::Client::new();

    let (code, first) = submit(&http, &s, "ada", "s1", "hello", Some("K-1")).await?;
    assert_eq!(code, 202, "{first}");
    assert_eq!(first["status"], "queued");
    assert_eq!(first["session"], "s1");
    let id = first["run_id"].as_str().ok_or("no run_id")?.to_owned();
    // The same key from the same user: the same run, 200.
    let (code, again) = submit(&http, &s, "ada", "s1", "hello", Some("K-1")).await?;
    assert_eq!((code, again["run_id"].as_str()), (200, Some(id.as_str())));
    // The same key from another user: a run of theirs.
    let (code, theirs) = submit(&http, &s, "bob", "s1", "hi", Some("K-1")).await?;
    assert_eq!(code, 202);
    assert_ne!(theirs["run_id"], first["run_id"]);

    let run = wait_run(&http, &s, "ada", &id, Duration::from_secs(30), finished).await?;
    assert_eq!(run["status"], "completed", "{run}; stderr: {}", s.stderr());
    assert_eq!(run["reply"], "done: hello");
    assert!(run["usage"].is_object(), "{run}");
    assert!(
        run["created"].is_string() && run["updated"].is_string(),
        "{run}"
    );

    // Another user's run is 404, and so is a hostile id.
    let (code, _) = get_run(&http, &s, "bob", &id).await?;
    assert_eq!(code, 404);
    for hostile in [
        "..%2F..%2Fetc%2Fpasswd",
        "run-x",
        "%00",
        "run-0123456789abcdef0123456789abcdef",
    ] {
        let resp = http
            .get(s.at(&format!("/v1/runs/{hostile}")))
            .header("x-hame-user", "ada")
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), 404, "{hostile}");
    }
    // A finished run cannot be cancelled: 409.
    let resp = http
        .post(s.at(&format!("/v1/runs/{id}/cancel")))
        .header("x-hame-user", "ada")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 409);
    // Bodies are checked: an unknown field is refused, not ignored.
    let resp = http
        .post(s.at("/v1/sessions/s1/runs"))
        .header("x-hame-user", "ada")
        .json(&json!({"message": "x", "priority": 9}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 400);
    // So is an Idempotency-Key out of its alphabet or length, with one line that says what
    // a key may be (not a store error).
    let long = "k".repeat(201);
    let keys: [&[u8]; 3] = [long.as_bytes(), "ключ".as_bytes(), b"a\xffb"];
    for key in keys {
        let resp = http
            .post(s.at("/v1/sessions/s1/runs"))
            .header("x-hame-user", "ada")
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(key)?,
            )
            .json(&json!({"message": "x"}))
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), 400, "{key:?}");
        let v: Value = resp.json().await?;
        assert_eq!(
            v["error"]["message"], "an Idempotency-Key is 1 to 200 visible ASCII characters",
            "{v}"
        );
    }

    // The session's runs, newest first.
    let (_, second) = submit(&http, &s, "ada", "s1", "again", None).await?;
    let second_id = second["run_id"].as_str().ok_or("no run_id")?.to_owned();
    wait_run(
        &http,
        &s,
        "ada",
        &second_id,
        Duration::from_secs(30),
        finished,
    )
    .await?;
    let list: Value = session_runs(&http, &s, "ada", "s1").await?;
    let ids: Vec<&str> = list["runs"]
        .as_array()
        .ok_or("no runs")?
        .iter()
        .filter_map(|r| r["run_id"].as_str())
        .collect();
    assert_eq!(ids, vec![second_id.as_str(), id.as_str()]);

    // The events of a finished run replay from the store: queued, running, completed.
    let text = http
        .get(s.at(&format!("/v1/runs/{id}/events")))
        .header("x-hame-user", "ada")
        .send()
        .await?
        .text()
        .await?;
    let names: Vec<String> = super::serve::parse_sse(&text)
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(
        names,
        vec!["completed"],
        "a finished run's stream is its end: {text}"
    );

    // The model saw each message once, in order, in one conversation.
    let users: Vec<String> = model
        .requests()
        .iter()
        .filter_map(|r| r.last_user_text())
        .collect();
    assert_eq!(users.iter().filter(|u| *u == "hello").count(), 1);

    // `hame runs` reads the same store without a server.
    let ws = dir.path().join("ws");
    let ws_arg = ws.to_string_lossy().into_owned();
    let state_home = dir.path().join("state").to_string_lossy().into_owned();
    let env = [("HAME_STATE_HOME", state_home.as_str())];
    let out = output(hame(
        &[
            "runs",
            "list",
            "--workspace",
            &ws_arg,
            "--user",
            "ada",
            "--json",
        ],
        &env,
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed: Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let out = output(hame(
        &["runs", "show", &id, "--workspace", &ws_arg, "--user", "ada"],
        &env,
        dir.path(),
    ))
    .await?;
    assert!(
        stdout(&out).contains("completed") && stdout(&out).contains("done: hello"),
        "{}",
        stdout(&out)
    );
    // Another user's run is not theirs to see: exit 2, one line.
    let out = output(hame(
        &["runs", "show", &id, "--workspace", &ws_arg, "--user", "bob"],
        &env,
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    Ok(())
}

/// `hame serve --no-worker` only accepts; `hame worker` processes execute. Runs of one
/// session run one at a time in order; a worker SIGKILLed in the middle of a run loses it
/// to another worker after `--run-lapse`, which completes it; a cancel sent to the server
/// stops a run executing in a worker.
async fn workers_drain_take_over_and_cancel(state: &str) -> TestResult {
    // `slow …` messages take 60 s to answer: the worker executing one is killed or the
    // run cancelled meanwhile.
    let model = slow_model().await?;
    let dir = tempfile::tempdir()?;
    let agent = unique_agent();
    let common = ["--agent", agent.as_str(), "--state", state];
    let mut serve_args = common.to_vec();
    serve_args.push("--no-worker");
    let s = Serve::start(dir.path(), &model.base_url(), &serve_args)?;
    let http = reqwest::Client::new();

    // Accepted, not executed.
    let mut ids = Vec::new();
    for i in 0..3 {
        for session in ["a", "b"] {
            let (code, v) = submit(&http, &s, "u", session, &format!("{session}{i}"), None).await?;
            assert_eq!(code, 202, "{v}");
            ids.push(v["run_id"].as_str().ok_or("no id")?.to_owned());
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, v) = get_run(&http, &s, "u", &ids[0]).await?;
    assert_eq!(v["status"], "queued", "--no-worker executes nothing");

    let mut worker_args = common.to_vec();
    worker_args.extend(["--run-lapse", "2"]);
    let w1 = WorkerProcess::start(dir.path(), &model.base_url(), &worker_args, "1")?;
    for id in &ids {
        let v = wait_run(&http, &s, "u", id, Duration::from_secs(60), finished).await?;
        assert_eq!(v["status"], "completed", "{v}; worker: {}", w1.stderr());
    }
    // One at a time, in order, per session: the model saw a0, a1, a2 in this order and
    // each request of a session carried the earlier exchanges.
    let reqs = model.requests();
    for session in ["a", "b"] {
        let seen: Vec<String> = reqs
            .iter()
            .filter_map(|r| r.last_user_text())
            .filter(|t| t.starts_with(session))
            .collect();
        assert_eq!(
            seen,
            vec![
                format!("{session}0"),
                format!("{session}1"),
                format!("{session}2")
            ]
        );
    }
    drop(w1);

    // Kill a worker mid-run: another one takes the run over and completes it.
    let mut w2 = WorkerProcess::start(dir.path(), &model.base_url(), &worker_args, "2")?;
    let (_, v) = submit(&http, &s, "u", "k", "slow one", None).await?;
    let slow = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let running = wait_run(&http, &s, "u", &slow, Duration::from_secs(30), |s| {
        s != "queued"
    })
    .await?;
    assert_eq!(running["status"], "running");
    w2.kill();
    let killed = Instant::now();
    // The retry is answered at once.
    model.set_responder(echo);
    let w3 = WorkerProcess::start(dir.path(), &model.base_url(), &worker_args, "3")?;
    let v = wait_run(&http, &s, "u", &slow, Duration::from_secs(60), finished).await?;
    assert_eq!(v["status"], "completed", "{v}; worker: {}", w3.stderr());
    assert_eq!(v["reply"], "done: slow one");
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(15), "taken over after {took:?}");
    let shown = runs_cli(dir.path(), &agent, state, &["show", &slow]).await?;
    assert_eq!(shown["attempts"], 2, "claimed twice: {shown}");

    // Cancel through the server a run that a worker process executes.
    model.set_responder(|r: &RecordedRequest| {
        ScriptStep::text("late").with_delay(
            if r.last_user_text().unwrap_or_default().starts_with("slow") {
                Duration::from_secs(60)
            } else {
                Duration::ZERO
            },
        )
    });
    let (_, v) = submit(&http, &s, "u", "c", "slow to cancel", None).await?;
    let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
    wait_run(&http, &s, "u", &id, Duration::from_secs(30), |s| {
        s != "queued"
    })
    .await?;
    let asked = Instant::now();
    let resp = http
        .post(s.at(&format!("/v1/runs/{id}/cancel")))
        .header("x-hame-user", "u")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 202);
    let v = wait_run(&http, &s, "u", &id, Duration::from_secs(10), finished).await?;
    assert_eq!(v["status"], "cancelled", "{v}; worker: {}", w3.stderr());
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(2), "cancelled after {took:?}");
    Ok(())
}

backend_tests!(workers_drain_take_over_and_cancel {
    workers_drain_take_over_and_cancel_on_json_state: json,
    workers_drain_take_over_and_cancel_on_postgres: "HAME_TEST_POSTGRES_URL",
    workers_drain_take_over_and_cancel_on_redis: "HAME_TEST_REDIS_URL",
    workers_drain_take_over_and_cancel_on_mysql: "HAME_TEST_MYSQL_URL",
});

/// `Idempotency-Key` retried 20 times concurrently against two replicas on one store
/// yields one run.
#[tokio::test]
async fn one_run_per_idempotency_key_across_replicas_on_postgres() -> TestResult {
    let Some(url) = service("HAME_TEST_POSTGRES_URL") else {
        return Ok(());
    };
    one_run_per_idempotency_key_across_replicas(&url).await
}

backend_tests!(one_run_per_idempotency_key_across_replicas {
    one_run_per_idempotency_key_across_replicas_on_redis: "HAME_TEST_REDIS_URL",
});

async fn one_run_per_idempotency_key_across_replicas(url: &str) -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(echo);
    let agent = unique_agent();
    let (da, db) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let args = ["--agent", agent.as_str(), "--state", url, "--no-worker"];
    let a = Serve::start(da.path(), &model.base_url(), &args)?;
    let b = Serve::start(db.path(), &model.base_url(), &args)?;
    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (http, at) = (http.clone(), if i % 2 == 0 { a.at("") } else { b.at("") });
        tasks.push(tokio::spawn(async move {
            let resp = http
                .post(format!("{at}/v1/sessions/s/runs"))
                .header("x-hame-user", "u")
                .header("idempotency-key", "same-key")
                .json(&json!({"message": "once"}))
                .send()
                .await?;
            let code = resp.status().as_u16();
            let v: Value = resp.json().await?;
            Ok::<_, reqwest::Error>((code, v["run_id"].as_str().unwrap_or_default().to_owned()))
        }));
    }
    let mut ids = std::collections::HashSet::new();
    let mut created = 0;
    for t in tasks {
        let (code, id) = t.await??;
        created += usize::from(code == 202);
        assert!(code == 202 || code == 200, "{code}");
        ids.insert(id);
    }
    assert_eq!((ids.len(), created), (1, 1), "{ids:?}");
    let list: Value = session_runs(&http, &b, "u", "s").await?;
    assert_eq!(list["runs"].as_array().map(Vec::len), Some(1));
    Ok(())
}

/// A worker SIGKILLed right after the run's turn was saved, before the run was marked
/// completed (failpoint `call.saved`): the worker that takes the run over finds the run id
/// in the saved state and completes it with the saved reply, without asking the model
/// again — the message is in the conversation once.
#[tokio::test]
async fn a_run_saved_by_a_dead_worker_is_not_run_again() -> TestResult {
    a_dead_workers_turn_is_not_run_again("call.saved").await
}

/// A cancel sent to replica B stops a long `execute` running on replica A within 2 s: B
/// writes the flag and wakes A (`NOTIFY` / pub-sub), A cancels the turn and kills the
/// command's process group.
async fn cancel_on_b_stops_an_execute_on_a(state: &str) -> TestResult {
    let model = ScriptedServer::start().await?;
    // The first request runs a shell that records its pid and sleeps; anything after the
    // tool result is a plain answer.
    model.set_responder(|r: &RecordedRequest| {
        let after_tool = after_tool(r);
        if !after_tool {
            ScriptStep::tool_call(
                "c1",
                "execute",
                json!({"command": "echo $$ > pid.txt; exec sleep 300"}),
            )
        } else {
            ScriptStep::text("woke up")
        }
    });
    let agent = unique_agent();
    let (da, db) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let common = [
        "--agent",
        agent.as_str(),
        "--state",
        state,
        "--permission-mode",
        "bypass",
    ];
    let a = Serve::start(da.path(), &model.base_url(), &common)?;
    let mut b_args = common.to_vec();
    b_args.push("--no-worker");
    let b = Serve::start(db.path(), &model.base_url(), &b_args)?;
    let http = reqwest::Client::new();
    let (code, v) = submit(&http, &b, "u", "s", "sleep", None).await?;
    assert_eq!(code, 202, "{v}");
    let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
    // Wait for the command to run on A.
    let pid_file = da.path().join("ws").join("pid.txt");
    let start = Instant::now();
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && let Ok(pid) = text.trim().parse::<u32>()
        {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the command never ran on A: {}",
            a.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    // Running, not a zombie waiting to be reaped.
    let alive = || {
        std::fs::read_to_string(proc_dir.join("stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
    };
    assert!(alive(), "the sleep runs");
    let (_, running) = get_run(&http, &b, "u", &id).await?;
    assert_eq!(running["status"], "running", "{running}");
    let asked = Instant::now();
    let resp = http
        .post(b.at(&format!("/v1/runs/{id}/cancel")))
        .header("x-hame-user", "u")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 202);
    let v = wait_run(&http, &b, "u", &id, Duration::from_secs(10), finished).await?;
    let took = asked.elapsed();
    assert_eq!(v["status"], "cancelled", "{v}; A: {}", a.stderr());
    // The sleep is dead (a zombie counts: it runs no more and its parent reaps it).
    while alive() && asked.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gone = asked.elapsed();
    assert!(!alive(), "the command still runs after {gone:?}");
    assert!(took < Duration::from_secs(2), "cancelled after {took:?}");
    eprintln!("cancel on B → run cancelled on A after {took:?}, child gone after {gone:?}");
    Ok(())
}

backend_tests!(cancel_on_b_stops_an_execute_on_a {
    a_cancel_sent_to_replica_b_stops_an_execute_on_a_on_postgres: "HAME_TEST_POSTGRES_URL",
    a_cancel_sent_to_replica_b_stops_an_execute_on_a_on_redis: "HAME_TEST_REDIS_URL",
});

/// The user and assistant texts of a session log, in order.
fn log_texts(path: &Path) -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let record: Value = serde_json::from_str(line)?;
        let role = record["role"].as_str().unwrap_or_default().to_owned();
        let content = &record["message"]["content"];
        let text = match content {
            Value::String(s) => s.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        };
        out.push((role, text));
    }
    Ok(out)
}

/// Done-when #1 of issue #31: two `hame serve` replicas on one store; 50 runs over 10
/// sessions submitted to replica A; A is SIGKILLed in the middle; B completes every run.
/// Every session log holds each user message exactly once and exactly one reply per run,
/// in submission order (one run of a session at a time), and no run ended twice.
async fn two_replicas_one_killed(state: &str) -> TestResult {
    const SESSIONS: usize = 10;
    const PER_SESSION: usize = 5;
    let model = ScriptedServer::start().await?;
    // Each answer takes 200 ms, so that A dies with runs in flight.
    model.set_responder(|r: &RecordedRequest| {
        ScriptStep::text(format!("done: {}", r.last_user_text().unwrap_or_default()))
            .with_delay(Duration::from_millis(200))
    });
    let dir = tempfile::tempdir()?;
    let agent = unique_agent();
    let args = [&lapsing(&agent, state)[..], &["--worker-concurrency", "4"]].concat();
    // One workspace (the session logs) and one state home for both replicas, as a shared
    // volume would give them.
    let mut a = Serve::start_named(dir.path(), "a", &model.base_url(), &args, &[])?;
    let b = Serve::start_named(dir.path(), "b", &model.base_url(), &args, &[])?;
    let http = reqwest::Client::new();
    let mut runs = Vec::new();
    for i in 0..PER_SESSION {
        for s in 0..SESSIONS {
            let message = format!("s{s} m{i}");
            let (code, v) = submit(&http, &a, "u", &format!("s{s}"), &message, None).await?;
            assert_eq!(code, 202, "{v}");
            runs.push((s, message, v["run_id"].as_str().ok_or("no id")?.to_owned()));
        }
    }
    // Kill A once a fifth of the runs completed.
    let start = Instant::now();
    loop {
        let mut done = 0;
        for s in 0..SESSIONS {
            let list: Value = http
                .get(b.at(&format!("/v1/sessions/s{s}/runs")))
                .header("x-hame-user", "u")
                .send()
                .await?
                .json()
                .await?;
            done += list["runs"].as_array().map_or(0, |r| {
                r.iter().filter(|r| r["status"] == "completed").count()
            });
        }
        if done >= SESSIONS * PER_SESSION / 5 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "runs do not complete: A: {}",
            a.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked_before = model.requests().len();
    a.kill();
    let killed = Instant::now();
    let killed_at = chrono::Utc::now();
    let mut last = killed_at;
    for (_, message, id) in &runs {
        let v = wait_run(&http, &b, "u", id, Duration::from_secs(40), finished).await?;
        assert_eq!(v["status"], "completed", "{v}; B: {}", b.stderr());
        assert_eq!(v["reply"], format!("done: {message}"), "{v}");
        if let Some(t) = v["updated"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        {
            last = last.max(t.with_timezone(&chrono::Utc));
        }
    }
    let failover = killed.elapsed();
    // Every run's model call was answered once, except those A had in flight: asked again.
    let again = model.requests().len() - runs.len();
    // The logs: each message once, one reply per run, in order — also for a turn whose
    // replica was killed between logging it and saving the state (the takeover adopts it
    // from the log instead of running it again).
    for s in 0..SESSIONS {
        let path = dir
            .path()
            .join("ws/u/agents")
            .join(&agent)
            .join(format!("sessions/s{s}.log.jsonl"));
        let texts = log_texts(&path)?;
        let want: Vec<(String, String)> = (0..PER_SESSION)
            .flat_map(|i| {
                let m = format!("s{s} m{i}");
                [
                    ("user".to_owned(), m.clone()),
                    ("assistant".to_owned(), format!("done: {m}")),
                ]
            })
            .collect();
        assert_eq!(texts, want, "session s{s}");
    }
    eprintln!(
        "{} runs; {again} model calls in flight on A asked again on B ({asked_before} asked before the kill); the last run ended {} ms after the kill (seen after {failover:?})",
        runs.len(),
        (last - killed_at).num_milliseconds()
    );
    Ok(())
}

backend_tests!(two_replicas_one_killed {
    two_replicas_one_killed_on_postgres: "HAME_TEST_POSTGRES_URL",
    two_replicas_one_killed_on_redis: "HAME_TEST_REDIS_URL",
});

/// `[runs] keep_finished` in hame.toml: a worker deletes the finished runs past it when it
/// starts (and every 10 minutes); a newer run stays. A value that is not a retention is
/// exit 2 naming the setting.
#[tokio::test]
async fn finished_runs_are_deleted_after_keep_finished() -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(echo);
    let dir = tempfile::tempdir()?;
    let state = tempfile::tempdir()?;
    let state = state.path().to_string_lossy().into_owned();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(ws.join("hame.toml"), "[runs]\nkeep_finished = \"1s\"\n")?;
    let agent = unique_agent();
    let common = ["--agent", agent.as_str(), "--state", state.as_str()];
    let mut serve_args = common.to_vec();
    serve_args.push("--no-worker");
    let s = Serve::start(dir.path(), &model.base_url(), &serve_args)?;
    let http = reqwest::Client::new();
    let (_, v) = submit(&http, &s, "u", "s", "old", None).await?;
    let old = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let w1 = WorkerProcess::start(dir.path(), &model.base_url(), &common, "1")?;
    let v = wait_run(&http, &s, "u", &old, Duration::from_secs(30), finished).await?;
    assert_eq!(v["status"], "completed", "{v}");
    drop(w1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, v) = submit(&http, &s, "u", "s", "new", None).await?;
    let new = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let w2 = WorkerProcess::start(dir.path(), &model.base_url(), &common, "2")?;
    let v = wait_run(&http, &s, "u", &new, Duration::from_secs(30), finished).await?;
    assert_eq!(v["status"], "completed", "{v}");
    let start = Instant::now();
    loop {
        let resp = http
            .get(s.at(&format!("/v1/runs/{old}")))
            .header("x-hame-user", "u")
            .send()
            .await?;
        if resp.status().as_u16() == 404 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the old run is still there: {}",
            w2.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, v) = get_run(&http, &s, "u", &new).await?;
    assert_eq!(
        (code, v["status"].as_str()),
        (200, Some("completed")),
        "{v}"
    );
    drop(w2);
    std::fs::write(ws.join("hame.toml"), "[runs]\nkeep_finished = \"soon\"\n")?;
    let out = output(hame(
        &[
            "runs",
            "list",
            "--workspace",
            &ws.to_string_lossy(),
            "--agent",
            &agent,
            "--state",
            &state,
        ],
        &[],
        dir.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("runs.keep_finished"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

/// Every file named `name` under `dir`.
fn find_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    hame_test_support::files_where(dir, &|p| p.file_name().is_some_and(|n| n == name))
}

/// A serve without a worker, one run of `message` submitted by `u` to session `s`, and
/// the arguments its workers take: `(dir, serve, run id, worker args)`.
async fn one_queued_run(
    model: &ScriptedServer,
    message: &str,
) -> Result<(tempfile::TempDir, Serve, String, Vec<String>), Box<dyn std::error::Error>> {
    one_queued_run_with(model, json!({ "message": message }), &[]).await
}

/// [`one_queued_run`] with the run's whole body and `files` written into the workspace
/// first.
async fn one_queued_run_with(
    model: &ScriptedServer,
    body: Value,
    files: &[(&str, &str)],
) -> Result<(tempfile::TempDir, Serve, String, Vec<String>), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    for (name, text) in files {
        std::fs::write(ws.join(name), text)?;
    }
    let state = dir
        .path()
        .join("state-store")
        .to_string_lossy()
        .into_owned();
    let agent = unique_agent();
    let common = vec!["--agent".to_owned(), agent, "--state".to_owned(), state];
    let mut serve_args: Vec<&str> = common.iter().map(String::as_str).collect();
    serve_args.push("--no-worker");
    let s = Serve::start(dir.path(), &model.base_url(), &serve_args)?;
    let v: Value = reqwest::Client::new()
        .post(s.at("/v1/sessions/s/runs"))
        .header("x-hame-user", "u")
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    let id = v["run_id"]
        .as_str()
        .ok_or_else(|| format!("no id: {v}"))?
        .to_owned();
    let mut worker_args = common;
    worker_args.extend(["--run-lapse", "2", "--permission-mode", "bypass"].map(String::from));
    Ok((dir, s, id, worker_args))
}

/// Polls `probe` every 50 ms until it has a value; after `limit`, fails with `what()`
/// (what the processes said, say).
async fn poll<T>(
    limit: Duration,
    what: impl Fn() -> String,
    mut probe: impl FnMut() -> Result<Option<T>, Box<dyn std::error::Error>>,
) -> Result<T, Box<dyn std::error::Error>> {
    let start = Instant::now();
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("not within {limit:?}: {}", what()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills `dying` (SIGKILL), starts the next worker with `args` and waits for the run to
/// end: its view, asserted `completed`, and the new worker.
async fn take_over(
    dying: &mut WorkerProcess,
    (dir, model, args): (&Path, &ScriptedServer, &[&str]),
    s: &Serve,
    id: &str,
) -> Result<(Value, WorkerProcess), Box<dyn std::error::Error>> {
    dying.kill();
    let next = WorkerProcess::start(dir, &model.base_url(), args, "next")?;
    let http = reqwest::Client::new();
    let v = wait_run(&http, s, "u", id, Duration::from_secs(30), finished).await?;
    assert_eq!(v["status"], "completed", "{v}; worker: {}", next.stderr());
    Ok((v, next))
}

/// A worker killed after logging a whole turn and before saving the state (failpoint
/// `call.before-save`): the worker that takes the run over finds the turn in the log and
/// ends the run with its reply (docs/replicas.md, "A turn logged but not saved").
#[tokio::test]
async fn a_turn_logged_but_not_saved_is_adopted_not_run_again() -> TestResult {
    a_dead_workers_turn_is_not_run_again("call.before-save").await
}

/// A worker killed at the failpoint `point`, after its turn reached the session log: the
/// next worker completes the run with the turn's reply and does not ask the model again;
/// the message and the reply are logged once and the state holds them (the next message's
/// request carries them once).
async fn a_dead_workers_turn_is_not_run_again(point: &str) -> TestResult {
    if !failpoints_built() {
        return Ok(());
    }
    let model = ScriptedServer::start().await?;
    model.set_responder(echo);
    let (dir, s, id, args) = one_queued_run(&model, "only once").await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut dying = dead_at(dir.path(), &model, &args, point).await?;
    let http = reqwest::Client::new();
    let (_, v) = get_run(&http, &s, "u", &id).await?;
    assert_eq!(
        v["status"], "running",
        "killed before the run was marked: {v}"
    );
    assert_eq!(model.requests().len(), 1, "{}", dying.stderr());
    let (v, _next) = take_over(&mut dying, (dir.path(), &model, &args), &s, &id).await?;
    assert_eq!(v["reply"], "done: only once", "{v}");
    assert_eq!(model.requests().len(), 1, "the model was asked once");
    let log = find_files(&dir.path().join("ws"), "s.log.jsonl")
        .pop()
        .ok_or("no session log")?;
    assert_eq!(
        log_texts(&log)?,
        vec![
            ("user".to_owned(), "only once".to_owned()),
            ("assistant".to_owned(), "done: only once".to_owned()),
        ]
    );
    let users = next_turn_carries(&http, &s, &model, ("again", "done: again"), "user").await?;
    assert_eq!(users, 2, "the state holds the turn once");
    Ok(())
}

/// Runs the session's next message (`(message, reply)`, as `u` in session `s`) and counts
/// the messages of `role` in the model's request for it: what the saved state held.
async fn next_turn_carries(
    http: &reqwest::Client,
    s: &Serve,
    model: &ScriptedServer,
    (message, reply): (&str, &str),
    role: &str,
) -> Result<usize, Box<dyn std::error::Error>> {
    let (_, next) = submit(http, s, "u", "s", message, None).await?;
    let next_id = next["run_id"].as_str().ok_or("no id")?;
    let v = wait_run(http, s, "u", next_id, Duration::from_secs(30), finished).await?;
    assert_eq!(v["reply"], reply, "{v}");
    let last = model.requests().pop().ok_or("no request")?;
    Ok(last.body["messages"]
        .as_array()
        .ok_or("no messages")?
        .iter()
        .filter(|m| m["role"] == role)
        .count())
}

/// A worker killed while the model prepares a turn's second step, after the first step's
/// tool call and result were logged: the takeover adopts that step and asks the model for
/// the next one. The tool ran once, the message and the call are logged once.
#[tokio::test]
async fn a_turn_cut_after_a_logged_step_goes_on_from_that_step() -> TestResult {
    let model = ScriptedServer::start().await?;
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let first = slow.clone();
    model.set_responder(move |r: &RecordedRequest| {
        let last_is_tool = after_tool(r);
        if !last_is_tool {
            ScriptStep::tool_call("c1", "execute", json!({"command": "echo ran >> count.txt"}))
        } else if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            ScriptStep::text("never seen").with_delay(Duration::from_secs(60))
        } else {
            ScriptStep::text("finished")
        }
    });
    let (dir, s, id, args) = one_queued_run(&model, "do it").await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut w1 = WorkerProcess::start(dir.path(), &model.base_url(), &args, "1")?;
    poll(
        Duration::from_secs(30),
        || w1.stderr(),
        || Ok((model.requests().len() >= 2).then_some(())),
    )
    .await?;
    let (v, _next) = take_over(&mut w1, (dir.path(), &model, &args), &s, &id).await?;
    assert_eq!(v["reply"], "finished", "{v}");
    assert_eq!(
        model.requests().len(),
        3,
        "the first step was not asked again"
    );
    let count = find_files(&dir.path().join("ws"), "count.txt")
        .pop()
        .ok_or("the tool never ran")?;
    assert_eq!(
        std::fs::read_to_string(count)?,
        "ran\n",
        "the tool ran once"
    );
    let (roles, log) = log_roles(&dir.path().join("ws"))?;
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{log}");
    // The request after the takeover is the dead worker's second step, as it was.
    let reqs = model.requests();
    assert_eq!(reqs[2].body["messages"], reqs[1].body["messages"]);
    Ok(())
}

/// `POST /v1/sessions/{s}/messages` is a run the request waits for: the answer is the
/// turn's as before, the run is listed (HTTP and `hame runs list`), and a replica killed
/// mid-request leaves a run that the other replica takes over and completes.
async fn a_message_request_is_a_run(state: &str) -> TestResult {
    // `slow …` takes 60 s the first time: replica A is killed meanwhile.
    let model = slow_model().await?;
    let dir = tempfile::tempdir()?;
    let agent = unique_agent();
    let args = lapsing(&agent, state);
    let mut a = Serve::start_named(dir.path(), "a", &model.base_url(), &args, &[])?;
    let b = Serve::start_named(dir.path(), "b", &model.base_url(), &args, &[])?;
    let http = reqwest::Client::new();

    // The same answer as before, and a run.
    let resp = http
        .post(a.at("/v1/sessions/s/messages"))
        .header("x-hame-user", "u")
        .json(&json!({"message": "hello"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await?;
    assert_eq!(body["reply"], "done: hello", "{body}");
    assert_eq!(body["session"], "s");
    assert_eq!(body["user"], "u");
    assert_eq!(body["iterations"], 1, "{body}");
    let list: Value = session_runs(&http, &b, "u", "s").await?;
    let runs = list["runs"].as_array().ok_or("no runs")?;
    assert_eq!(runs.len(), 1, "{list}");
    assert_eq!(runs[0]["status"], "completed", "{list}");
    assert_eq!(runs[0]["reply"], "done: hello", "{list}");
    let listed = runs_cli(dir.path(), &agent, state, &["list", "s"]).await?;
    assert!(
        listed
            .to_string()
            .contains(runs[0]["run_id"].as_str().ok_or("no id")?),
        "hame runs list shows it: {listed}"
    );
    // Another user does not see it.
    let theirs: Value = session_runs(&http, &b, "v", "s").await?;
    assert_eq!(theirs["runs"], json!([]), "{theirs}");

    // A request whose replica dies: its run is completed by B.
    let pending = {
        let (http, url) = (http.clone(), a.at("/v1/sessions/k/messages"));
        tokio::spawn(async move {
            http.post(url)
                .header("x-hame-user", "u")
                .json(&json!({"message": "slow one"}))
                .send()
                .await
        })
    };
    let start = Instant::now();
    let id = loop {
        let list: Value = session_runs(&http, &b, "u", "k").await?;
        if let Some(r) = list["runs"].as_array().and_then(|r| r.first())
            && r["status"] == "running"
            && model
                .requests()
                .iter()
                .any(|q| q.last_user_text().is_some_and(|t| t == "slow one"))
        {
            break r["run_id"].as_str().ok_or("no id")?.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never running: {list}; A: {}",
            a.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    model.set_responder(echo);
    a.kill();
    let killed = Instant::now();
    assert!(pending.await?.is_err(), "the request died with A");
    let v = wait_run(&http, &b, "u", &id, Duration::from_secs(30), finished).await?;
    let took = killed.elapsed();
    assert_eq!(v["status"], "completed", "{v}; B: {}", b.stderr());
    assert_eq!(v["reply"], "done: slow one", "{v}");
    // Failover: the lapse (2 s) plus at most one idle wait (1 s), and the model call.
    assert!(took < Duration::from_secs(5), "taken over after {took:?}");
    eprintln!("a /messages run taken over {took:?} after its replica died");
    Ok(())
}

backend_tests!(a_message_request_is_a_run {
    a_message_request_is_a_run_on_postgres: "HAME_TEST_POSTGRES_URL",
    a_message_request_is_a_run_on_redis: "HAME_TEST_REDIS_URL",
});

/// A message to a session busy with another turn is queued and answered when a worker
/// has run it: the same answer as a turn run in the request (`iterations` included, the
/// schemathesis run found it missing), and the run records its model requests.
#[tokio::test]
async fn a_message_queued_behind_a_busy_session_answers_like_a_turn() -> TestResult {
    let model = delayed_model("first", Duration::from_millis(1500)).await?;
    let dir = tempfile::tempdir()?;
    let s = Serve::start(dir.path(), &model.base_url(), &[])?;
    let http = reqwest::Client::new();
    let post = |text: &'static str| {
        let (http, url) = (http.clone(), s.at("/v1/sessions/s/messages"));
        tokio::spawn(async move {
            let resp = http
                .post(url)
                .header("x-hame-user", "u")
                .json(&json!({"message": text}))
                .send()
                .await?;
            let code = resp.status().as_u16();
            Ok::<_, reqwest::Error>((code, resp.json::<Value>().await?))
        })
    };
    let first = post("first");
    poll(
        Duration::from_secs(20),
        || s.stderr(),
        || {
            let asked = model
                .requests()
                .iter()
                .any(|q| q.last_user_text().is_some_and(|t| t == "first"));
            Ok(asked.then_some(()))
        },
    )
    .await?;
    let (code, second) = post("second").await??;
    assert_eq!(code, 200, "{second}");
    assert_eq!(second["reply"], "done: second", "{second}");
    assert_eq!(second["iterations"], 1, "{second}");
    assert_eq!(second["session"], "s", "{second}");
    assert!(
        second["usage"]["input_tokens"].as_u64().is_some(),
        "{second}"
    );
    assert!(second["usage"].get("requests").is_none(), "{second}");
    let (code, first) = first.await??;
    assert_eq!((code, &first["iterations"]), (200, &json!(1)), "{first}");
    let list: Value = session_runs(&http, &s, "u", "s").await?;
    let runs = list["runs"].as_array().ok_or("no runs")?;
    assert_eq!(runs.len(), 2, "{list}");
    assert!(
        runs.iter().all(|r| r["usage"]["requests"] == 1),
        "a run records its model requests: {list}"
    );
    Ok(())
}

/// The arguments of a replica of `agent` on `state` whose runs lapse 2 s after their last
/// renewal.
fn lapsing<'a>(agent: &'a str, state: &'a str) -> [&'a str; 6] {
    ["--agent", agent, "--state", state, "--run-lapse", "2"]
}

/// The arguments that name user `u` of `agent` on the workspace `ws` and `state`.
fn user_u<'a>(ws: &'a str, agent: &'a str, state: &'a str) -> [&'a str; 8] {
    [
        "--workspace",
        ws,
        "--user",
        "u",
        "--agent",
        agent,
        "--state",
        state,
    ]
}

/// The `run_id` of the answer `r` to a run's submission.
async fn run_id_of(r: reqwest::Response) -> Result<String, Box<dyn std::error::Error>> {
    Ok(r.json::<Value>().await?["run_id"]
        .as_str()
        .ok_or("no run_id")?
        .to_owned())
}

/// `hame runs <args> --json` as user `u` of `agent` on the workspace `dir/ws`: its JSON.
async fn runs_cli(
    dir: &Path,
    agent: &str,
    state: &str,
    args: &[&str],
) -> Result<Value, Box<dyn std::error::Error>> {
    let ws = dir.join("ws").to_string_lossy().into_owned();
    let mut all = vec!["runs"];
    all.extend_from_slice(args);
    all.push("--json");
    all.extend(user_u(&ws, agent, state));
    let out = output(hame(&all, &[], dir)).await?;
    Ok(serde_json::from_str(&stdout(&out)).map_err(|e| format!("{e}: {}", stderr(&out)))?)
}

/// The parent's side of the background-task tests: "spawn it" spawns a background
/// `general-purpose` child, the tool result is answered "spawned", anything else "noted".
fn spawner(r: &RecordedRequest) -> ScriptStep {
    let after_tool = after_tool(r);
    match (after_tool, r.last_user_text().as_deref()) {
        (true, _) => ScriptStep::text("spawned"),
        (false, Some("spawn it")) => ScriptStep::tool_call(
            "c1",
            "agent_spawn",
            json!({"agent_id": "general-purpose", "task": "find the answer", "background": true}),
        ),
        _ => ScriptStep::text("noted"),
    }
}

/// The first task record in a session's task folder, if any.
fn first_record(tasks: &Path) -> Option<Value> {
    std::fs::read_dir(tasks)
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|e| serde_json::from_slice::<Value>(&std::fs::read(e.path()).ok()?).ok())
}

/// Done-when #2 of issue #31: a background subagent task goes through the run queue. Two
/// `hame serve` replicas on one store; the parent spawns a background child; the replica
/// whose worker runs the child is SIGKILLed during the child's model call; the other
/// replica takes the task's run over (after `--run-lapse`), runs the child again from its
/// saved state and writes the result into the task record; the parent's next call — on
/// the surviving replica — gets it exactly once (one notification in the session log and
/// in the model's request, and not again in the call after).
async fn a_background_task_survives_its_replica(state: &str) -> TestResult {
    const RESULT: &str = "CHILD-RESULT-42";
    let model = ScriptedServer::start().await?;
    let child_asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let child_asked = child_asked.clone();
        model.set_responder(move |r: &RecordedRequest| {
            if r.system_text().contains("## Subagent context") {
                // The first child call hangs until its replica is killed.
                let n = child_asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let step = ScriptStep::text(RESULT);
                return if n == 0 {
                    step.with_delay(Duration::from_secs(60))
                } else {
                    step
                };
            }
            spawner(r)
        });
    }
    let dir = tempfile::tempdir()?;
    let agent = unique_agent();
    let args = lapsing(&agent, state);
    let mut replicas = [
        Serve::start_named(dir.path(), "a", &model.base_url(), &args, &[])?,
        Serve::start_named(dir.path(), "b", &model.base_url(), &args, &[])?,
    ];
    let http = reqwest::Client::new();
    let (code, v) = submit(&http, &replicas[0], "u", "p", "spawn it", None).await?;
    assert_eq!(code, 202, "{v}");
    let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let v = wait_run(
        &http,
        &replicas[0],
        "u",
        &id,
        Duration::from_secs(30),
        finished,
    )
    .await?;
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["reply"], "spawned");
    // The task record names its run; the child's model call is in flight.
    let tasks = dir.path().join("ws/u/agents").join(&agent).join("tasks/p");
    let start = Instant::now();
    let record = loop {
        let found = first_record(&tasks);
        if let Some(r) = found
            && r["status"] == "running"
            && child_asked.load(std::sync::atomic::Ordering::SeqCst) == 1
        {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the child never ran: A: {} B: {}",
            replicas[0].stderr(),
            replicas[1].stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let task_id = record["task_id"].as_str().ok_or("no task id")?.to_owned();
    let run_id = record["run_id"]
        .as_str()
        .ok_or("the record names no run")?
        .to_owned();
    let run = runs_cli(dir.path(), &agent, state, &["show", &run_id]).await?;
    assert_eq!(run["status"], "running", "{run}");
    assert_eq!(run["session"], record["child_session"], "{run}");
    // Kill the replica whose worker runs the child (its pid ends the worker name).
    let worker = run["worker"].as_str().ok_or("no worker")?;
    let victim = replicas
        .iter()
        .position(|s| worker.ends_with(&format!(":{}", s.pid())))
        .ok_or_else(|| format!("worker {worker} is neither replica"))?;
    replicas[victim].kill();
    let killed = Instant::now();
    let survivor = &replicas[1 - victim];
    let run = wait_run(
        &http,
        survivor,
        "u",
        &run_id,
        Duration::from_secs(30),
        finished,
    )
    .await?;
    assert_eq!(
        run["status"],
        "completed",
        "{run}; survivor: {}",
        survivor.stderr()
    );
    assert_eq!(run["reply"], RESULT);
    let shown = runs_cli(dir.path(), &agent, state, &["show", &run_id]).await?;
    assert_eq!(shown["attempts"], 2, "claimed twice: {shown}");
    let took = killed.elapsed();
    assert_eq!(
        child_asked.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the child's model call was made again once"
    );
    // The parent's next call, on the survivor, gets the result once; the one after, not again.
    for message in ["what came back?", "anything else?"] {
        let (code, v) = submit(&http, survivor, "u", "p", message, None).await?;
        assert_eq!(code, 202, "{v}");
        let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
        let v = wait_run(&http, survivor, "u", &id, Duration::from_secs(30), finished).await?;
        assert_eq!(
            v["status"],
            "completed",
            "{v}; survivor: {}",
            survivor.stderr()
        );
        let requests = model.requests();
        let last = requests
            .iter()
            .rev()
            .find(|r| !r.system_text().contains("## Subagent context"))
            .ok_or("no parent request")?;
        let body = last.body.to_string();
        assert_eq!(
            body.matches("<system-notification>").count(),
            1,
            "{message}: {body}"
        );
        assert_eq!(body.matches(RESULT).count(), 1, "{message}: {body}");
        assert!(body.contains(&task_id), "{body}");
    }
    let log = dir
        .path()
        .join("ws/u/agents")
        .join(&agent)
        .join("sessions/p.log.jsonl");
    let pushed: Vec<(String, String)> = log_texts(&log)?
        .into_iter()
        .filter(|(_, t)| t.contains("<system-notification>"))
        .collect();
    assert_eq!(pushed.len(), 1, "one delivery in the log: {pushed:?}");
    assert_eq!(pushed[0].0, "user");
    assert!(pushed[0].1.contains(RESULT), "{pushed:?}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(tasks.join(format!("{task_id}.json")))?)?;
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["result"], RESULT);
    assert!(record["delivered_at"].is_string(), "{record}");
    eprintln!("background task: replica killed mid-child; the other completed it {took:?} later");
    Ok(())
}

backend_tests!(a_background_task_survives_its_replica {
    a_background_task_survives_its_replica_on_postgres: "HAME_TEST_POSTGRES_URL",
    a_background_task_survives_its_replica_on_redis: "HAME_TEST_REDIS_URL",
});

/// A spawner SIGKILLed between writing a queued task's record and submitting its run
/// (failpoint `subagent.recorded`) leaves a record whose run does not exist: the parent
/// session's next call — here the killed run taken over by another replica — fails the
/// record ("not in the run queue") and tells the parent once; it never waits for it.
#[tokio::test]
async fn a_task_whose_run_was_never_queued_is_failed_and_told_once() -> TestResult {
    if !cfg!(feature = "failpoints") {
        hame_test_env::skip(format_args!(
            "the queued-task kill test needs `--features failpoints` (CI runs --all-features)"
        ));
        return Ok(());
    }
    let model = ScriptedServer::start().await?;
    model.set_responder(spawner);
    let dir = tempfile::tempdir()?;
    let agent = unique_agent();
    let args = ["--agent", agent.as_str(), "--run-lapse", "2"];
    let mut a = Serve::start_named(
        dir.path(),
        "a",
        &model.base_url(),
        &args,
        &[("HAME_FAILPOINT", "subagent.recorded")],
    )?;
    let http = reqwest::Client::new();
    let (code, v) = submit(&http, &a, "u", "p", "spawn it", None).await?;
    assert_eq!(code, 202, "{v}");
    let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let tasks = dir.path().join("ws/u/agents").join(&agent).join("tasks/p");
    let start = Instant::now();
    let record = loop {
        let found = first_record(&tasks);
        if let Some(r) = found {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no record: {}",
            a.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(record["status"], "pending", "{record}");
    let task_id = record["task_id"].as_str().ok_or("no task id")?.to_owned();
    let run_id = record["run_id"].as_str().ok_or("no run id")?.to_owned();
    // A killed itself at the failpoint; make sure it is gone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill();
    let b = Serve::start_named(dir.path(), "b", &model.base_url(), &args, &[])?;
    let v = wait_run(&http, &b, "u", &id, Duration::from_secs(30), finished).await?;
    assert_eq!(v["status"], "completed", "{v}; B: {}", b.stderr());
    let (code, _) = get_run(&http, &b, "u", &run_id).await?;
    assert_eq!(code, 404, "the task's run was never submitted");
    let (code, v) = submit(&http, &b, "u", "p", "anything else?", None).await?;
    assert_eq!(code, 202, "{v}");
    let next = v["run_id"].as_str().ok_or("no id")?.to_owned();
    wait_run(&http, &b, "u", &next, Duration::from_secs(30), finished).await?;
    let requests = model.requests();
    let last = requests.last().ok_or("no request")?.body.to_string();
    assert_eq!(last.matches("<system-notification>").count(), 1, "{last}");
    assert_eq!(last.matches("is not in the run queue").count(), 1, "{last}");
    assert!(last.contains(&task_id), "{last}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(tasks.join(format!("{task_id}.json")))?)?;
    assert_eq!(record["status"], "failed", "{record}");
    assert!(record["delivered_at"].is_string(), "{record}");
    Ok(())
}

/// `task_cancel` of a queued task that a worker of the same replica runs: the child is
/// stopped at once, the record ends `cancelled` ("cancelled by task_cancel") and the
/// task's run `cancelled`.
#[tokio::test]
async fn task_cancel_stops_a_queued_task_through_its_run() -> TestResult {
    task_cancel_stops_a_task_through_its_run(None).await
}

/// The same across processes: the API replica runs with `--no-worker` and executes the
/// parent's turns itself (`POST …/messages`), the task runs in a `hame worker` process;
/// the cancel reaches it through the run (its flag and the wake-up).
async fn task_cancel_reaches_a_task_in_another_process(state: &str) -> TestResult {
    task_cancel_stops_a_task_through_its_run(Some(state)).await
}

backend_tests!(task_cancel_reaches_a_task_in_another_process {
    task_cancel_reaches_a_task_in_another_process_on_json: json,
    task_cancel_reaches_a_task_in_another_process_on_postgres: "HAME_TEST_POSTGRES_URL",
    task_cancel_reaches_a_task_in_another_process_on_redis: "HAME_TEST_REDIS_URL",
});

/// `state`: `None` runs one `hame serve` with its worker; `Some(url)` an API replica
/// without a worker and a `hame worker` process on that state store.
async fn task_cancel_stops_a_task_through_its_run(state: Option<&str>) -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(|r: &RecordedRequest| {
        if r.system_text().contains("## Subagent context") {
            return ScriptStep::text("late").with_delay(Duration::from_secs(60));
        }
        if r.last_user_text().as_deref() == Some("cancel it") {
            let body = r.body.to_string();
            // The spawned task's id, from the spawn's tool result.
            let id = body
                .match_indices("task-")
                .filter_map(|(i, _)| body.get(i..i + 17))
                .find(|t| {
                    t[5..].bytes().all(|b| b.is_ascii_hexdigit()) && !t.ends_with("0123456789ab")
                })
                .unwrap_or_default()
                .to_owned();
            let after_tool = after_tool(r);
            return if after_tool {
                ScriptStep::text("cancelled it")
            } else {
                ScriptStep::tool_call("c2", "task_cancel", json!({"task_id": id}))
            };
        }
        spawner(r)
    });
    let dir = tempfile::tempdir()?;
    let agent = unique_agent();
    let mut args = vec!["--agent", agent.as_str()];
    if let Some(url) = state {
        args.extend(["--state", url]);
    }
    let mut serve_args = args.clone();
    if state.is_some() {
        serve_args.push("--no-worker");
    }
    let s = Serve::start_named(dir.path(), "a", &model.base_url(), &serve_args, &[])?;
    let worker = match state {
        Some(_) => Some(WorkerProcess::start(
            dir.path(),
            &model.base_url(),
            &args,
            "w",
        )?),
        None => None,
    };
    let http = reqwest::Client::new();
    // A turn of the parent: a run the worker executes, or a message the API replica runs.
    let turn = async |text: &str| -> Result<Value, Box<dyn std::error::Error>> {
        if state.is_some() {
            let resp = http
                .post(s.at("/v1/sessions/p/messages"))
                .header("x-hame-user", "u")
                .json(&json!({"message": text}))
                .send()
                .await?;
            return Ok(resp.json().await?);
        }
        let (_, v) = submit(&http, &s, "u", "p", text, None).await?;
        let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
        wait_run(&http, &s, "u", &id, Duration::from_secs(30), finished).await
    };
    let v = turn("spawn it").await?;
    assert_eq!(v["reply"], "spawned", "{v}");
    let tasks = dir.path().join("ws/u/agents").join(&agent).join("tasks/p");
    let start = Instant::now();
    let record = loop {
        if let Some(r) = first_record(&tasks)
            && r["status"] == "running"
        {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{}", s.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let run_id = record["run_id"].as_str().ok_or("no run id")?.to_owned();
    let asked = Instant::now();
    let v = turn("cancel it").await?;
    assert_eq!(
        v["reply"],
        "cancelled it",
        "{v}; {}; {}",
        s.stderr(),
        worker
            .as_ref()
            .map(WorkerProcess::stderr)
            .unwrap_or_default()
    );
    let run = wait_run(&http, &s, "u", &run_id, Duration::from_secs(10), finished).await?;
    let took = asked.elapsed();
    assert_eq!(run["status"], "cancelled", "{run}");
    let record = first_record(&tasks).ok_or("no record")?;
    assert_eq!(record["status"], "cancelled", "{record}");
    assert_eq!(record["error"], "cancelled by task_cancel", "{record}");
    assert!(took < Duration::from_secs(5), "cancelled after {took:?}");
    Ok(())
}

/// One line per record of a session log: `user: text`, `assistant: text`, `assistant:
/// call <id> <tool>`, `tool: result <id>`.
fn log_lines(path: &Path) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let record: Value = serde_json::from_str(line)?;
        let role = record["role"].as_str().unwrap_or_default();
        for block in record["message"]["content"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let what = match block["type"].as_str() {
                Some("text") => block["text"].as_str().unwrap_or_default().to_owned(),
                Some("tool_call") => format!(
                    "call {} {}",
                    block["id"].as_str().unwrap_or_default(),
                    block["name"].as_str().unwrap_or_default()
                ),
                Some("tool_result") => {
                    format!("result {}", block["id"].as_str().unwrap_or_default())
                }
                _ => continue,
            };
            out.push(format!("{role}: {what}"));
        }
    }
    Ok(out)
}

/// Two `hame serve` replicas (each with a worker, `--run-lapse 2`) on `state`, sharing one
/// workspace whose `execute` calls ask for approval.
struct AskingReplicas {
    dir: tempfile::TempDir,
    agent: String,
    a: Serve,
    b: Serve,
    http: reqwest::Client,
}

impl AskingReplicas {
    fn start(state: &str, model: &ScriptedServer) -> Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws)?;
        std::fs::write(
            ws.join("tools.json"),
            json!({"permissions": {"ask": ["execute"]}}).to_string(),
        )?;
        let agent = unique_agent();
        let args = lapsing(&agent, state);
        let a = Serve::start_named(dir.path(), "a", &model.base_url(), &args, &[])?;
        let b = Serve::start_named(dir.path(), "b", &model.base_url(), &args, &[])?;
        Ok(Self {
            dir,
            agent,
            a,
            b,
            http: reqwest::Client::new(),
        })
    }

    /// Submits `message` to session `s` of user `u` on A and waits until its run waits for
    /// a decision on an `execute` call: the run id and the approval id.
    async fn waiting(&self, message: &str) -> Result<(String, String), Box<dyn std::error::Error>> {
        let (code, v) = submit(&self.http, &self.a, "u", "s", message, None).await?;
        assert_eq!(code, 202, "{v}");
        let id = v["run_id"].as_str().ok_or("no id")?.to_owned();
        let run = wait_run(
            &self.http,
            &self.a,
            "u",
            &id,
            Duration::from_secs(30),
            finished,
        )
        .await?;
        assert_eq!(run["status"], "waiting_approval", "{run}");
        assert_eq!(run["approvals"][0]["tool"], "execute", "{run}");
        let approval = run["approvals"][0]["id"]
            .as_str()
            .ok_or("no approval id")?
            .to_owned();
        Ok((id, approval))
    }
}

/// Issue #31: an approval decision is a run's next leg. A run whose tool call needs an
/// approval ends `waiting_approval` and holds its session: a second run submitted meanwhile
/// stays queued (the model never sees it), and a message to the session answers 202 with
/// the same approval and makes no run. The decision, posted to replica B, resumes the
/// waiting run there (the tool runs once); the run ends `completed` with the reply and its
/// approval carries the decision; then the second run runs. The session log holds the
/// message, the tool call, its result and the reply once each.
async fn an_approval_decision_resumes_the_run(state: &str) -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(|r: &RecordedRequest| {
        let after_tool = after_tool(r);
        let text = r.last_user_text().unwrap_or_default();
        if after_tool {
            ScriptStep::text("counted")
        } else if text == "count it" {
            ScriptStep::tool_call(
                "c1",
                "execute",
                json!({"command": "echo once >> count.txt"}),
            )
        } else {
            ScriptStep::text(format!("done: {text}"))
        }
    });
    let r = AskingReplicas::start(state, &model)?;
    let (dir, ws, agent, a, b, http) = (
        &r.dir,
        r.dir.path().join("ws"),
        &r.agent,
        &r.a,
        &r.b,
        &r.http,
    );
    let (first, approval) = r.waiting("count it").await?;

    // The session waits for the decision: the next run stays queued.
    let (code, v) = submit(http, a, "u", "s", "second", None).await?;
    assert_eq!(code, 202, "{v}");
    let second = v["run_id"].as_str().ok_or("no id")?.to_owned();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, queued) = get_run(http, b, "u", &second).await?;
    assert_eq!(queued["status"], "queued", "{queued}");
    // A message answers with the waiting call, as before, and makes no run.
    let resp = http
        .post(b.at("/v1/sessions/s/messages"))
        .header("x-hame-user", "u")
        .json(&json!({"message": "hurry up"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 202);
    let body: Value = resp.json().await?;
    assert_eq!(body["status"], "approval_needed", "{body}");
    assert_eq!(body["approvals"][0]["id"], approval.as_str(), "{body}");
    let list: Value = http
        .get(b.at("/v1/sessions/s/runs"))
        .header("x-hame-user", "u")
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(
        list["runs"].as_array().map(Vec::len),
        Some(2),
        "no run for the message: {list}"
    );
    let asked: Vec<String> = model
        .requests()
        .iter()
        .filter_map(|r| r.last_user_text())
        .collect();
    assert!(
        !asked.iter().any(|t| t == "second" || t == "hurry up"),
        "nothing of the session ran before the decision: {asked:?}"
    );
    assert!(
        find_files(dir.path(), "count.txt").is_empty(),
        "not run yet"
    );

    // Hostile decisions change nothing: every field is honoured or refused, another
    // user's decision finds nothing.
    for (user, bad, want) in [
        (
            "u",
            json!({"decision": "approve", "reason": "because"}),
            400,
        ),
        ("u", json!({"decision": "deny", "always": true}), 400),
        ("u", json!({"decision": "approve", "colour": "red"}), 400),
        ("u", json!({"decision": "Approve"}), 400),
        ("u", json!({"decision": ["approve"]}), 400),
        ("v", json!({"decision": "approve"}), 404),
    ] {
        let resp = http
            .post(b.at(&format!("/v1/sessions/s/approvals/{approval}")))
            .header("x-hame-user", user)
            .json(&bad)
            .send()
            .await?;
        let code = resp.status().as_u16();
        let text = resp.text().await?;
        assert_eq!(code, want, "{bad}: {text}");
    }
    let (_, still) = get_run(http, b, "u", &first).await?;
    assert_eq!(still["status"], "waiting_approval", "{still}");

    // The decision, on the other replica: the waiting run resumes there.
    let resp = http
        .post(b.at(&format!("/v1/sessions/s/approvals/{approval}")))
        .header("x-hame-user", "u")
        .json(&json!({"decision": "approve"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await?;
    assert_eq!(body["reply"], "counted", "{body}");
    let done = wait_run(http, a, "u", &first, Duration::from_secs(10), |s| {
        s != "running"
    })
    .await?;
    assert_eq!(done["status"], "completed", "{done}; B: {}", b.stderr());
    assert_eq!(done["reply"], "counted", "{done}");
    assert_eq!(done["approvals"][0]["id"], approval.as_str(), "{done}");
    assert_eq!(
        done["approvals"][0]["decision"],
        json!({"approve": true}),
        "{done}"
    );
    let again = http
        .post(b.at(&format!("/v1/sessions/s/approvals/{approval}")))
        .header("x-hame-user", "u")
        .json(&json!({"decision": "approve"}))
        .send()
        .await?;
    assert_eq!(again.status().as_u16(), 404, "a decision is taken once");
    let next = wait_run(http, a, "u", &second, Duration::from_secs(30), |s| {
        s == "completed" || s == "failed" || s == "cancelled"
    })
    .await?;
    assert_eq!(next["status"], "completed", "{next}");
    assert_eq!(next["reply"], "done: second", "{next}");

    // The tool ran once; the log holds each part of the turn once.
    let counts = find_files(dir.path(), "count.txt");
    assert_eq!(counts.len(), 1, "{counts:?}");
    assert_eq!(std::fs::read_to_string(&counts[0])?, "once\n");
    let log = dir
        .path()
        .join("ws/u/agents")
        .join(agent)
        .join("sessions/s.log.jsonl");
    let turn = [
        "user: count it",
        "assistant: call c1 execute",
        "tool: result c1",
        "assistant: counted",
    ];
    let mut want: Vec<&str> = turn.to_vec();
    want.extend(["user: second", "assistant: done: second"]);
    assert_eq!(
        log_lines(&log)?,
        want,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    // `hame approve`, without a server, resumes the waiting run too.
    let (third, approval) = r.waiting("count it").await?;
    let ws_arg = ws.to_string_lossy().into_owned();
    let state_home = dir.path().join("state").to_string_lossy().into_owned();
    let base = model.base_url();
    let mut args = vec!["approve", "--model", "openai:m", "--no-memory"];
    args.extend(user_u(&ws_arg, agent, state));
    args.extend(["--session", "s", &approval]);
    let out = output(hame(
        &args,
        &[
            ("OPENAI_BASE_URL", base.as_str()),
            ("HAME_STATE_HOME", state_home.as_str()),
        ],
        dir.path(),
    ))
    .await?;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("counted"), "{}", stdout(&out));
    let (_, done) = get_run(http, b, "u", &third).await?;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["reply"], "counted", "{done}");
    assert_eq!(std::fs::read_to_string(&counts[0])?, "once\nonce\n");
    want.extend(turn);
    assert_eq!(log_lines(&log)?, want);

    // A cancelled waiting run releases the session; its call still waits, so the next run
    // fails saying so (its message is not swallowed); a denial, outside the queue now,
    // ends the turn, and the session runs again.
    let (fourth, approval) = r.waiting("count it").await?;
    let (_, v) = submit(http, a, "u", "s", "after the cancel", None).await?;
    let fifth = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let resp = http
        .post(b.at(&format!("/v1/runs/{fourth}/cancel")))
        .header("x-hame-user", "u")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 202);
    let v: Value = resp.json().await?;
    assert_eq!(v["status"], "cancelled", "{v}");
    let failed = wait_run(http, a, "u", &fifth, Duration::from_secs(30), finished).await?;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "session_waiting", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&approval)),
        "{failed}"
    );
    let resp = http
        .post(b.at(&format!("/v1/sessions/s/approvals/{approval}")))
        .header("x-hame-user", "u")
        .json(&json!({"decision": "deny", "reason": "not again"}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 200);
    let (_, v) = submit(http, a, "u", "s", "last", None).await?;
    let last = v["run_id"].as_str().ok_or("no id")?.to_owned();
    let done = wait_run(http, a, "u", &last, Duration::from_secs(30), finished).await?;
    assert_eq!(done["reply"], "done: last", "{done}");
    assert_eq!(std::fs::read_to_string(&counts[0])?, "once\nonce\n");
    Ok(())
}

backend_tests!(an_approval_decision_resumes_the_run {
    an_approval_decision_resumes_the_run_on_json_state: json,
    an_approval_decision_resumes_the_run_on_postgres: "HAME_TEST_POSTGRES_URL",
    an_approval_decision_resumes_the_run_on_redis: "HAME_TEST_REDIS_URL",
});

/// A decided leg whose replica is SIGKILLed while the approved tool runs: the worker that
/// takes the run over does not run the tool again; the model is told `outcome_unknown`
/// and the run completes with its answer.
async fn a_decided_leg_cut_by_a_kill_is_not_run_again(state: &str) -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(|r: &RecordedRequest| {
        let last = r.body["messages"].as_array().and_then(|m| m.last());
        match last {
            Some(m) if m["role"] == "tool" => {
                let unknown = m["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("outcome_unknown"));
                ScriptStep::text(if unknown { "unknown" } else { "ran" })
            }
            _ => ScriptStep::tool_call(
                "c1",
                "execute",
                json!({"command": "echo $$ >> job.txt; exec sleep 20"}),
            ),
        }
    });
    let mut r = AskingReplicas::start(state, &model)?;
    let (id, approval) = r.waiting("the job").await?;
    let (dir, http) = (r.dir.path().to_owned(), r.http.clone());
    let decision = {
        let (http, url) = (
            http.clone(),
            r.b.at(&format!("/v1/sessions/s/approvals/{approval}")),
        );
        tokio::spawn(async move {
            http.post(url)
                .header("x-hame-user", "u")
                .json(&json!({"decision": "approve"}))
                .send()
                .await
        })
    };
    // The approved command runs on B: B dies.
    let start = Instant::now();
    let job = loop {
        if let Some(p) = find_files(&dir, "job.txt").first()
            && std::fs::read_to_string(p).is_ok_and(|t| t.ends_with('\n'))
        {
            break p.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the command never ran on B: {}",
            r.b.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    r.b.kill();
    assert!(
        decision.await?.is_err(),
        "the decision's request died with B"
    );
    let done = wait_run(&http, &r.a, "u", &id, Duration::from_secs(30), |s| {
        s != "running"
    })
    .await?;
    let pids = std::fs::read_to_string(&job)?;
    // The orphaned sleep of the dead replica is ours to stop.
    for pid in pids.lines() {
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    }
    assert_eq!(done["status"], "completed", "{done}; A: {}", r.a.stderr());
    assert_eq!(done["reply"], "unknown", "{done}");
    assert_eq!(
        pids.lines().count(),
        1,
        "the approved command ran once: {pids}"
    );
    Ok(())
}

backend_tests!(a_decided_leg_cut_by_a_kill_is_not_run_again {
    a_decided_leg_cut_by_a_kill_is_not_run_again_on_json_state: json,
    a_decided_leg_cut_by_a_kill_is_not_run_again_on_postgres: "HAME_TEST_POSTGRES_URL",
    a_decided_leg_cut_by_a_kill_is_not_run_again_on_redis: "HAME_TEST_REDIS_URL",
});

/// A decided leg killed after it logged the tool's result and the reply, before it saved
/// them (failpoint `call.before-save` on the replica the decision was posted to): the
/// worker that takes the run over adopts the leg from the log. The approved command ran
/// once, the model was not asked again, and the log holds every record once.
async fn a_decided_leg_logged_but_not_saved_is_adopted(state: &str) -> TestResult {
    if !failpoints_built() {
        return Ok(());
    }
    let model = ScriptedServer::start().await?;
    model.set_responder(|r: &RecordedRequest| {
        let after_tool = after_tool(r);
        if after_tool {
            ScriptStep::text("counted")
        } else if r.last_user_text().as_deref() == Some("count it") {
            ScriptStep::tool_call(
                "c1",
                "execute",
                json!({"command": "echo once >> count.txt"}),
            )
        } else {
            ScriptStep::text("again done")
        }
    });
    let r = AskingReplicas::start(state, &model)?;
    let (id, approval) = r.waiting("count it").await?;
    let args = lapsing(&r.agent, state);
    let mut dying = Serve::start_named(
        r.dir.path(),
        "dying",
        &model.base_url(),
        &args,
        &[("HAME_FAILPOINT", "call.before-save")],
    )?;
    let decided = r
        .http
        .post(dying.at(&format!("/v1/sessions/s/approvals/{approval}")))
        .header("x-hame-user", "u")
        .json(&json!({"decision": "approve"}))
        .send()
        .await;
    assert!(decided.is_err(), "the deciding replica died mid-request");
    dying.kill();
    assert_eq!(model.requests().len(), 2, "{}", dying.stderr());
    let done = wait_run(&r.http, &r.a, "u", &id, Duration::from_secs(30), finished).await?;
    assert_eq!(done["status"], "completed", "{done}; A: {}", r.a.stderr());
    assert_eq!(done["reply"], "counted", "{done}");
    assert_eq!(model.requests().len(), 2, "the model was not asked again");
    let ws = r.dir.path().join("ws");
    let count = find_files(&ws, "count.txt")
        .pop()
        .ok_or("the command never ran")?;
    assert_eq!(std::fs::read_to_string(count)?, "once\n", "it ran once");
    let (roles, log) = log_roles(&ws)?;
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{log}");
    // The saved state holds the leg: the session's next message runs after it.
    let tools = next_turn_carries(&r.http, &r.a, &model, ("again", "again done"), "tool").await?;
    assert_eq!(tools, 1, "the state holds the result once");
    Ok(())
}

backend_tests!(a_decided_leg_logged_but_not_saved_is_adopted {
    a_decided_leg_logged_but_not_saved_is_adopted_on_json_state: json,
    a_decided_leg_logged_but_not_saved_is_adopted_on_postgres: "HAME_TEST_POSTGRES_URL",
});

/// A worker SIGKILLed while a tool call runs: the worker that takes the run over does not
/// run the call again; the session log and the next model request carry an
/// `outcome_unknown` result with the call's id and arguments, and the model answers.
#[tokio::test]
async fn a_tool_call_cut_by_a_kill_is_outcome_unknown_and_not_run_twice() -> TestResult {
    a_cut_tool_call_is_outcome_unknown(false).await
}

/// The same in a turn's second step, after the first was logged: the takeover adopts the
/// first step (its call's result stands, it is not run or asked again) and settles the
/// second step's call before asking the model.
#[tokio::test]
async fn a_tool_call_cut_in_a_later_step_is_outcome_unknown_not_run_twice() -> TestResult {
    a_cut_tool_call_is_outcome_unknown(true).await
}

async fn a_cut_tool_call_is_outcome_unknown(later_step: bool) -> TestResult {
    let model = ScriptedServer::start().await?;
    model.set_responder(move |r: &RecordedRequest| {
        let body = r.body.to_string();
        let tools = r.body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
        if body.contains("outcome_unknown") {
            ScriptStep::text("checked")
        } else if later_step && tools == 0 {
            ScriptStep::tool_call("c1", "execute", json!({"command": "echo a >> one.txt"}))
        } else {
            ScriptStep::tool_call(
                "cut",
                "execute",
                json!({"command": "echo ran >> count.txt; sleep 60"}),
            )
        }
    });
    let (dir, s, id, args) = one_queued_run(&model, "do it").await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut w1 = WorkerProcess::start(dir.path(), &model.base_url(), &args, "1")?;
    let ws = dir.path().join("ws");
    let count = poll(
        Duration::from_secs(30),
        || w1.stderr(),
        || Ok(find_files(&ws, "count.txt").pop()),
    )
    .await?;
    let (v, _next) = take_over(&mut w1, (dir.path(), &model, &args), &s, &id).await?;
    assert_eq!(v["reply"], "checked", "{v}");
    assert_eq!(
        std::fs::read_to_string(&count)?,
        "ran\n",
        "the cut call ran once"
    );
    let asked = model.requests().len();
    assert_eq!(asked, if later_step { 3 } else { 2 }, "no step asked twice");
    if later_step {
        let one = find_files(&ws, "one.txt").pop().ok_or("no one.txt")?;
        assert_eq!(
            std::fs::read_to_string(one)?,
            "a\n",
            "step 1's call ran once"
        );
    }
    // The model request after the takeover carried the outcome, with the call id and
    // arguments.
    let told: Vec<String> = model
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .filter(|b| b.contains("outcome_unknown"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains("NOT run again") && told[0].contains("\"cut\""),
        "{}",
        told[0]
    );
    assert!(told[0].contains("count.txt"), "the arguments: {}", told[0]);
    let log_path = find_files(&ws, "s.log.jsonl")
        .pop()
        .ok_or("no session log")?;
    let log = std::fs::read_to_string(&log_path)?;
    assert!(log.contains("outcome_unknown"), "{log}");
    let roles: Vec<String> = log_texts(&log_path)?.into_iter().map(|(r, _)| r).collect();
    let step = ["assistant", "tool"];
    let mut expected = vec!["user"];
    if later_step {
        expected.extend(step);
    }
    expected.extend(step);
    expected.push("assistant");
    assert_eq!(roles, expected, "each record once: {log}");
    let intents = find_files(&ws, "s.intents.jsonl")
        .pop()
        .ok_or("no intents")?;
    let intents = std::fs::read_to_string(intents)?;
    assert!(intents.contains("\"end\":\"outcome_unknown\""), "{intents}");
    Ok(())
}

/// A run with a required check whose worker died after logging the whole turn, before
/// saving it: the takeover adopts the turn and the completion gate still gives its
/// verdict (the check's evidence, recorded before the kill, still stands).
#[tokio::test]
async fn an_adopted_turn_keeps_its_completion_gate() -> TestResult {
    if !failpoints_built() {
        return Ok(());
    }
    let model = ScriptedServer::start().await?;
    model.set_responder(echo);
    let (dir, s, id, args) = one_queued_run_with(
        &model,
        json!({"message": "check it", "verify": ["tests"]}),
        &[
            (
                "hame.toml",
                "[[verify]]\nname = \"tests\"\ncommand = \"grep -q fine ok.txt\"\n",
            ),
            ("ok.txt", "fine\n"),
        ],
    )
    .await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut dying = dead_at(dir.path(), &model, &args, "call.before-save").await?;
    let (v, _next) = take_over(&mut dying, (dir.path(), &model, &args), &s, &id).await?;
    assert_eq!(v["reply"], "done: check it", "{v}");
    assert_eq!(model.requests().len(), 1, "the model was asked once");
    assert_eq!(v["verification"]["status"], "verified", "{v}");
    assert_eq!(v["verification"]["evidence"][0]["check"], "tests", "{v}");
    Ok(())
}

/// Whether this build kills itself at failpoints (`--features failpoints`); a skip that
/// says so when not.
fn failpoints_built() -> bool {
    if !cfg!(feature = "failpoints") {
        hame_test_env::skip(
            "the run takeover kill tests need `--features failpoints` (CI runs --all-features)",
        );
    }
    cfg!(feature = "failpoints")
}

/// The roles of session `s`'s log records under the workspace `ws`, in order, and the log.
fn log_roles(ws: &Path) -> Result<(Vec<String>, String), Box<dyn std::error::Error>> {
    let path = find_files(ws, "s.log.jsonl")
        .pop()
        .ok_or("no session log")?;
    let roles = log_texts(&path)?.into_iter().map(|(r, _)| r).collect();
    Ok((roles, std::fs::read_to_string(&path)?))
}

/// A worker (`args`) started with the failpoint `point`, once it died there. Polled: the
/// scripted model answers on this test's runtime.
async fn dead_at(
    dir: &Path,
    model: &ScriptedServer,
    args: &[&str],
    point: &str,
) -> Result<WorkerProcess, Box<dyn std::error::Error>> {
    let mut dying = WorkerProcess::start_env(
        dir,
        &model.base_url(),
        args,
        "dying",
        &[("HAME_FAILPOINT", point)],
    )?;
    let stderr = dying.stderr.clone();
    poll(
        Duration::from_secs(60),
        || std::fs::read_to_string(&stderr).unwrap_or_default(),
        || Ok(dying.child.try_wait()?),
    )
    .await?;
    Ok(dying)
}

/// Whether a model request follows a tool result (the step after a tool call).
fn after_tool(r: &RecordedRequest) -> bool {
    r.body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["role"] == "tool")
}
