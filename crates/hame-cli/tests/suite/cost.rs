//! Issue #34, black-box: prompt caching on the wire (Anthropic breakpoints, OpenAI
//! `prompt_cache_key`), cached tokens reported in `--json`, the session log and
//! `/metrics`; budgets that stop `hame run` (exit 6) and `hame serve` (429
//! `budget_exceeded`) across processes; `hame usage`.

use hame_test_support::{ScriptStep, ScriptUsage, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{hame, output, stderr, stdout};
use super::serve::{Serve, client, metric, ws_log};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `hame <args>` with a workspace `dir/ws`, state under `dir/state`, against `server` as
/// the provider of `model` (`openai:m` or `anthropic:...`).
async fn hame_at(
    dir: &std::path::Path,
    server: &ScriptedServer,
    model: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::io::Result<std::process::Output> {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws)?;
    let state = dir.join("state").to_string_lossy().into_owned();
    let ws = ws.to_string_lossy().into_owned();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--workspace", &ws, "--no-memory", "--model", model]);
    let (base, url) = if model.starts_with("anthropic:") {
        ("ANTHROPIC_BASE_URL", server.url())
    } else {
        ("OPENAI_BASE_URL", server.base_url())
    };
    let mut vars: Vec<(&str, &str)> = vec![(base, &url), ("HAME_STATE_HOME", &state)];
    vars.extend_from_slice(env);
    output(hame(&all, &vars, dir)).await
}

/// The `cache_control` breakpoints anywhere in a request body.
fn breakpoints(v: &Value) -> usize {
    match v {
        Value::Object(o) => {
            usize::from(o.contains_key("cache_control"))
                + o.values().map(breakpoints).sum::<usize>()
        }
        Value::Array(a) => a.iter().map(breakpoints).sum(),
        _ => 0,
    }
}

fn usage(input: u64, output: u64, cached: u64) -> ScriptUsage {
    ScriptUsage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
    }
}

#[tokio::test]
async fn anthropic_requests_carry_breakpoints_and_cached_tokens_are_reported() -> TestResult {
    let dir = tempfile::tempdir()?;
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("toolu_1", "ls", json!({"path": "/"}))
            .with_cached_usage(usage(5_000, 20, 0)),
        ScriptStep::text("done").with_cached_usage(usage(5_100, 10, 4_900)),
    ]);
    let out = hame_at(
        dir.path(),
        &server,
        "anthropic:claude-sonnet-4-5",
        &["run", "--json", "--session", "s1", "list the files"],
        &[("ANTHROPIC_API_KEY", "sk-ant-test")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    let eph = json!({"type": "ephemeral"});
    for r in &reqs {
        let b = &r.body;
        assert!(breakpoints(b) <= 4, "{b}");
        assert_eq!(b["system"][0]["cache_control"], eph, "{b}");
        let tools = b["tools"].as_array().ok_or("no tools")?;
        assert_eq!(tools[tools.len() - 1]["cache_control"], eph);
        assert!(
            tools[..tools.len() - 1]
                .iter()
                .all(|t| t.get("cache_control").is_none())
        );
        let msgs = b["messages"].as_array().ok_or("no messages")?;
        let last = msgs[msgs.len() - 1]["content"]
            .as_array()
            .ok_or("no content")?;
        assert_eq!(last[last.len() - 1]["cache_control"], eph, "{b}");
        assert!(b.get("prompt_cache_key").is_none());
    }
    // The second request reads the first one's prefix: same system and tools, and the
    // first request's last turn still carries its breakpoint.
    assert_eq!(reqs[0].body["system"], reqs[1].body["system"]);
    assert_eq!(reqs[0].body["tools"], reqs[1].body["tools"]);
    assert_eq!(reqs[1].body["messages"][0], reqs[0].body["messages"][0]);
    assert_eq!(breakpoints(&reqs[1].body), 4);

    let v: Value = serde_json::from_str(stdout(&out).trim())?;
    assert_eq!(v["usage"]["input_tokens"], json!(10_100));
    assert_eq!(v["usage"]["cached_input_tokens"], json!(4_900));
    let log = ws_log(dir.path(), None, "s1");
    let logged: Vec<Value> = log
        .iter()
        .filter(|r| r["role"] == "assistant")
        .map(|r| r["usage"].clone())
        .collect();
    assert_eq!(logged.len(), 2, "{log:?}");
    assert_eq!(logged[1]["cached_input_tokens"], json!(4_900));

    // prompt_cache = "off" in hame.toml: no breakpoint, the system prompt a string.
    std::fs::write(dir.path().join("ws/hame.toml"), "prompt_cache = \"off\"\n")?;
    server.push(ScriptStep::text("plain"));
    let out = hame_at(
        dir.path(),
        &server,
        "anthropic:claude-sonnet-4-5",
        &["run", "--session", "s2", "hi"],
        &[("ANTHROPIC_API_KEY", "sk-ant-test")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let last = server.requests().pop().ok_or("no request")?;
    assert_eq!(breakpoints(&last.body), 0, "{}", last.body);
    assert!(last.body["system"].is_string());
    Ok(())
}

#[tokio::test]
async fn openai_gets_one_prompt_cache_key_per_session_naming_no_id() -> TestResult {
    let dir = tempfile::tempdir()?;
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::text("a"),
        ScriptStep::text("b"),
        ScriptStep::text("c"),
        ScriptStep::text("d"),
    ]);
    let on = [("HAME_PROMPT_CACHE", "on")];
    for (session, user) in [
        ("s1", "alice"),
        ("s1", "alice"),
        ("s2", "alice"),
        ("s1", "bob"),
    ] {
        let out = hame_at(
            dir.path(),
            &server,
            "openai:m",
            &["run", "--session", session, "--user", user, "hi"],
            &on,
        )
        .await?;
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let keys: Vec<String> = server
        .requests()
        .iter()
        .map(|r| {
            r.body["prompt_cache_key"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(
        keys.iter().all(|k| k.starts_with("hame-") && k.len() == 21),
        "{keys:?}"
    );
    assert_eq!(keys[0], keys[1], "one session, one key");
    assert_ne!(keys[0], keys[2], "another session");
    assert_ne!(keys[0], keys[3], "another user");
    assert!(
        keys.iter()
            .all(|k| !k.contains("alice") && !k.contains("s1"))
    );
    // By default a server that is not api.openai.com gets no key.
    server.push(ScriptStep::text("e"));
    let out = hame_at(dir.path(), &server, "openai:m", &["run", "hi"], &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let last = server.requests().pop().ok_or("no request")?;
    assert_eq!(last.body.get("prompt_cache_key"), None);
    // A setting that is not auto, on or off is exit 2 naming it.
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &["run", "hi"],
        &[("HAME_PROMPT_CACHE", "maybe")],
    )
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("HAME_PROMPT_CACHE"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

#[tokio::test]
async fn a_session_budget_stops_the_next_process_with_exit_6_and_nothing_is_lost() -> TestResult {
    let dir = tempfile::tempdir()?;
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "ls", json!({"path": "/"})).with_usage(600, 20),
        ScriptStep::text("first answer").with_usage(700, 30),
    ]);
    let budget = ["--budget", "session.tokens=1000"];
    let run = |msg: &'static str, extra: &'static [&'static str]| {
        let mut args = vec!["run", "--session", "s1"];
        args.extend_from_slice(&budget);
        args.extend_from_slice(extra);
        args.push(msg);
        args
    };
    // Under the limit before each request: the run finishes (it crosses the limit with its
    // last request, which was allowed).
    let out = hame_at(dir.path(), &server, "openai:m", &run("one", &[]), &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(server.request_count(), 2);

    // Another process: the session has spent 1,350 tokens; no request is sent.
    let out = hame_at(dir.path(), &server, "openai:m", &run("two", &[]), &[]).await?;
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("budget exceeded: session tokens spent 1350 of 1000")
            && err.contains("--budget session.tokens=N"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(server.request_count(), 2, "no request after the limit");
    // The log says so, and the message is kept.
    let texts: Vec<String> = ws_log(dir.path(), None, "s1")
        .iter()
        .map(|r| r["message"].to_string())
        .collect();
    assert!(texts.iter().any(|t| t.contains("two")), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.contains("budget exceeded")),
        "{texts:?}"
    );

    // A larger budget: the session takes calls again, with all it had.
    server.push(ScriptStep::text("again"));
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &[
            "run",
            "--session",
            "s1",
            "--budget",
            "session.tokens=5000",
            "three",
        ],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let last = server.requests().pop().ok_or("no request")?;
    let sent = last.body["messages"].to_string();
    assert!(
        sent.contains("first answer") && sent.contains("two"),
        "{sent}"
    );

    // hame usage: by session and model, as saved.
    let out = hame_at(dir.path(), &server, "openai:m", &["usage", "--json"], &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim())?;
    assert_eq!(v["sessions"][0]["session"], "s1");
    assert_eq!(v["sessions"][0]["model"], "openai:m");
    assert_eq!(v["sessions"][0]["requests"], 3);
    assert_eq!(
        v["total"]["output_tokens"],
        v["sessions"][0]["output_tokens"]
    );
    assert_eq!(v["total"]["requests"], 3);
    let out = hame_at(dir.path(), &server, "openai:m", &["usage"], &[]).await?;
    let table = stdout(&out);
    assert!(
        table.starts_with("SESSION") && table.contains("s1") && table.contains("openai:m"),
        "{table}"
    );
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &["usage", "--since", "2999-01-01"],
        &[],
    )
    .await?;
    assert_eq!(stdout(&out).trim(), "no spend recorded");
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &["usage", "--since", "yesterday"],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    Ok(())
}

#[tokio::test]
async fn a_run_budget_ends_the_run_between_steps_and_hostile_budgets_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let server = ScriptedServer::start().await?;
    server.push_all([
        ScriptStep::tool_call("c1", "ls", json!({"path": "/"})).with_usage(500, 20),
        ScriptStep::text("never sent"),
    ]);
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &["run", "--json", "--budget", "run.input_tokens=400", "go"],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("run input_tokens spent 500 of 400"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.request_count(), 1);
    // The tool ran and its result is in the log: nothing lost.
    let log = ws_log(dir.path(), None, "default");
    assert!(log.iter().any(|r| r["role"] == "tool"), "{log:?}");
    for bad in ["run.usd=-1", "week.usd=1", "run.tokens=lots", "run.usd=NaN"] {
        let out = hame_at(
            dir.path(),
            &server,
            "openai:m",
            &["run", "--budget", bad, "x"],
            &[],
        )
        .await?;
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
    }
    // A dollar budget on a model without a price says how to add one.
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &["run", "--session", "s9", "--budget", "run.usd=1", "x"],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("[prices.\"openai:m\"]"),
        "{}",
        stderr(&out)
    );
    Ok(())
}

#[tokio::test]
async fn a_user_day_dollar_budget_counts_every_session_of_the_user() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("ws"))?;
    std::fs::write(
        dir.path().join("ws/hame.toml"),
        "[prices.\"openai:m\"]\ninput = 10.0\noutput = 30.0\ncached_input = 1.0\n\
         [budget.user_day]\nusd = 0.01\n",
    )?;
    let server = ScriptedServer::start().await?;
    // 1,000 input (200 cached) and 100 output: 800 × $10 + 200 × $1 + 100 × $30 per
    // million = $0.0112.
    server.push(ScriptStep::text("a").with_cached_usage(usage(1_000, 100, 200)));
    let args = |s: &'static str, u: &'static str| ["run", "--session", s, "--user", u, "hi"];
    let out = hame_at(dir.path(), &server, "openai:m", &args("a", "alice"), &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Another session of alice: over the day's budget.
    let out = hame_at(dir.path(), &server, "openai:m", &args("b", "alice"), &[]).await?;
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("user_day usd spent $0.0112 of $0.0100"),
        "{}",
        stderr(&out)
    );
    // Bob is not alice.
    server.push(ScriptStep::text("b"));
    let out = hame_at(dir.path(), &server, "openai:m", &args("a", "bob"), &[]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = hame_at(
        dir.path(),
        &server,
        "openai:m",
        &["usage", "--json", "--user", "alice"],
        &[],
    )
    .await?;
    let v: Value = serde_json::from_str(stdout(&out).trim())?;
    let usd = v["total"]["usd"].as_f64().unwrap_or_default();
    assert!((usd - 0.0112).abs() < 1e-9, "{v}");
    Ok(())
}

#[tokio::test]
async fn serve_answers_429_budget_exceeded_with_what_was_spent() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push(ScriptStep::text("one").with_cached_usage(usage(900, 200, 300)));
    let serve = Serve::start(
        dir.path(),
        &model.base_url(),
        &["--budget", "session.tokens=1000"],
    )?;
    let first = client()
        .post(serve.at("/v1/sessions/s1/messages"))
        .json(&json!({"message": "hi"}))
        .send()
        .await?;
    assert_eq!(first.status(), 200);
    let second = client()
        .post(serve.at("/v1/sessions/s1/messages"))
        .json(&json!({"message": "again"}))
        .send()
        .await?;
    assert_eq!(second.status(), 429);
    let body: Value = second.json().await?;
    assert_eq!(body["error"]["code"], "budget_exceeded");
    assert_eq!(body["error"]["budget"]["scope"], "session");
    assert_eq!(body["error"]["budget"]["limit"], "tokens");
    assert_eq!(body["error"]["budget"]["spent"], json!(1100.0));
    assert_eq!(
        body["error"]["budget"]["usage"]["cached_input_tokens"],
        json!(300)
    );
    assert_eq!(model.request_count(), 1);
    assert_eq!(
        metric(&serve, "hame_tokens_total{agent=\"hame\",kind=\"cached\"}").await?,
        300.0
    );
    // Another session is not this one.
    model.push(ScriptStep::text("other"));
    let other = client()
        .post(serve.at("/v1/sessions/s2/messages"))
        .json(&json!({"message": "hi"}))
        .send()
        .await?;
    assert_eq!(other.status(), 200);
    Ok(())
}

#[tokio::test]
async fn a_message_may_carry_its_own_budget_which_only_tightens_the_servers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    // Only what is sent is scripted: a stopped run sends no more.
    model.push(ScriptStep::tool_call("c1", "ls", json!({"path": "/"})).with_usage(300, 10));
    let serve = Serve::start(
        dir.path(),
        &model.base_url(),
        &["--budget", "run.tokens=500"],
    )?;
    let post = |session: &'static str, body: Value| {
        let url = serve.at(&format!("/v1/sessions/{session}/messages"));
        async move { client().post(url).json(&body).send().await }
    };
    // The caller's 100 tokens: the run stops after its first request.
    let r = post(
        "s1",
        json!({"message": "go", "budget": {"run": {"tokens": 100}}}),
    )
    .await?;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await?;
    assert_eq!(body["error"]["budget"]["max"], json!(100.0));
    assert_eq!(model.request_count(), 1);
    // Asking for more than the server allows gets the server's limit.
    // Only what is sent is scripted: a stopped run sends no more.
    model.push(ScriptStep::tool_call("c2", "ls", json!({"path": "/"})).with_usage(600, 10));
    let r = post(
        "s2",
        json!({"message": "go", "budget": {"run": {"tokens": 1000000}}}),
    )
    .await?;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await?;
    assert_eq!(body["error"]["budget"]["max"], json!(500.0));
    // A budget that is not one is a 400 naming it; no turn runs.
    let before = model.request_count();
    for bad in [
        json!({"run": {"usd": -1}}),
        json!({"week": {"usd": 1}}),
        json!({"run": {"tokens": "lots"}}),
        json!("run.usd=1"),
    ] {
        let r = post("s3", json!({"message": "go", "budget": bad})).await?;
        assert_eq!(r.status(), 400, "{bad}");
        let body: Value = r.json().await?;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("budget"),
            "{body}"
        );
    }
    assert_eq!(model.request_count(), before);
    Ok(())
}
