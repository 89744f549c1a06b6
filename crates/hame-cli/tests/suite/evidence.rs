//! Issue #33 through `hame run`: action observations, verifiers bound to versions and the
//! completion gate (docs/evidence.md).

use hame_test_support::ScriptStep;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use sha2::Digest;

use super::common::{Scratch, last_tool_result, stderr, stdout, texts_of_role};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A check that passes once `ok.txt` holds `fine`.
const TOML: &str =
    "[[verify]]\nname = \"tests\"\ncommand = \"grep -q fine ok.txt\"\nexpect = { exit_code = 0 }\n";

fn sha(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The version of the workspace files as the evidence computes it: SHA-256 over
/// `path \0 sha256(content) \n`, sorted by path.
fn workspace_hash(files: &[(&str, &str)]) -> String {
    let mut sorted = files.to_vec();
    sorted.sort();
    let mut h = sha2::Sha256::new();
    for (path, content) in sorted {
        h.update(path.as_bytes());
        h.update([0]);
        h.update(sha(content.as_bytes()).as_bytes());
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `hame sessions WHAT default --json` (`evidence`, `observations`), parsed.
async fn evidence_json(s: &Scratch) -> Result<Value, Box<dyn std::error::Error>> {
    s.session_json("evidence", &[]).await
}

#[tokio::test]
async fn an_answer_without_running_the_tests_exits_5_after_one_extra_step_naming_the_check()
-> TestResult {
    let s = Scratch::scripted([ScriptStep::text("done"), ScriptStep::text("done, really")]).await?;
    s.write("hame.toml", TOML)?;
    s.write("ok.txt", "broken\n")?;
    let out = s
        .run_code(5, &s.ws_args(&["--verify", "tests"]), "fix it", &[])
        .await?;
    // The reply is printed; the failing evidence is shown.
    assert_eq!(stdout(&out), "done, really\n");
    let err = stderr(&out);
    assert!(err.contains("unverified"), "{err}");
    assert!(err.contains("tests failed"), "{err}");
    assert!(err.contains("exit code 1"), "{err}");
    // The model got exactly one extra step, and it names the failing check.
    let reqs = s.server.requests();
    assert_eq!(reqs.len(), 2);
    let users = texts_of_role(&reqs[1].body, "user");
    let last = users.last().cloned().unwrap_or_default();
    assert!(last.contains("check `tests`: failed"), "{last}");
    assert!(last.contains("grep -q fine ok.txt"), "{last}");
    // The check's run is an observation and its evidence names it.
    let ev = evidence_json(&s).await?;
    assert_eq!(ev[0]["check"], "tests");
    assert_eq!(ev[0]["outcome"], "failed");
    assert_eq!(ev[0]["exit_code"], 1);
    assert_eq!(ev[0]["stale"], false);
    let obs = s.session_json("observations", &[]).await?;
    let check = obs
        .as_array()
        .and_then(|a| a.iter().find(|o| o["tool"] == "verify"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(check["id"], ev[0]["observation_id"]);
    assert_eq!(check["facts"]["exit_code"], 1);
    Ok(())
}

#[tokio::test]
async fn running_the_tests_then_answering_exits_0_with_the_workspace_hash_until_a_covered_file_changes()
-> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "ok.txt", "content": "fine\n"}),
        ),
        ScriptStep::tool_call("c2", "execute", json!({"command": "grep -q fine ok.txt"})),
        ScriptStep::text("fixed"),
    ])
    .await?;
    s.write("hame.toml", TOML)?;
    let out = s
        .run_code(
            0,
            &s.ws_args(&["--verify", "tests", "--no-memory"]),
            "fix it",
            &[],
        )
        .await?;
    assert_eq!(stdout(&out), "fixed\n");
    let err = stderr(&out);
    assert!(err.contains("verified by"), "{err}");
    assert!(err.contains("tests passed"), "{err}");
    // No extra step: the model's own run of the command is the evidence.
    assert_eq!(s.server.requests().len(), 3);
    let ev = evidence_json(&s).await?;
    assert_eq!(ev.as_array().map(Vec::len), Some(1));
    assert_eq!(ev[0]["outcome"], "passed");
    assert_eq!(ev[0]["stale"], false);
    assert_eq!(
        ev[0]["version"],
        workspace_hash(&[("hame.toml", TOML), ("ok.txt", "fine\n")]).as_str()
    );
    assert_eq!(ev[0]["files"], 2);
    // The evidence names the observation of the model's `execute` call.
    let obs = s.session_json("observations", &[]).await?;
    let exec = obs
        .as_array()
        .and_then(|a| a.iter().find(|o| o["call_id"] == "c2"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(exec["id"], ev[0]["observation_id"]);
    // Editing a covered file afterwards makes the evidence stale.
    s.write("ok.txt", "fine\nand more\n")?;
    let ev = evidence_json(&s).await?;
    assert_eq!(ev[0]["stale"], true);
    Ok(())
}

#[tokio::test]
async fn an_execute_observation_has_exit_code_and_stdout_truncated_and_the_model_text_is_unchanged()
-> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call("c1", "execute", json!({"command": "echo hello; exit 3"})),
        ScriptStep::tool_call(
            "c2",
            "write_file",
            json!({"file_path": "a.txt", "content": "x"}),
        ),
        ScriptStep::text("ok"),
    ])
    .await?;
    s.run_ws(&["--no-memory"], "go").await?;
    let reqs = s.server.requests();
    // What the model sees is the tool's text as before.
    assert_eq!(last_tool_result(&reqs[1].body), "hello\n\n[exit code 3]");
    let obs = s.session_json("observations", &[]).await?;
    let obs = obs.as_array().cloned().unwrap_or_default();
    assert_eq!(obs.len(), 2, "{obs:?}");
    let exec = &obs[0];
    assert_eq!(exec["tool"], "execute");
    assert_eq!(exec["call_id"], "c1");
    assert_eq!(exec["attempt"], 1);
    assert_eq!(exec["outcome"], "ok");
    assert_eq!(exec["facts"]["exit_code"], 3);
    assert_eq!(exec["facts"]["stdout_truncated"], false);
    assert_eq!(exec["facts"]["stderr_truncated"], false);
    assert_eq!(exec["facts"]["stdout_bytes"], 6);
    assert_eq!(exec["facts"]["signal"], Value::Null);
    assert_eq!(
        exec["args_hash"],
        sha(br#"{"command":"echo hello; exit 3"}"#).as_str()
    );
    let write = &obs[1];
    assert_eq!(write["tool"], "write_file");
    assert_eq!(write["facts"]["path"], "a.txt");
    assert_eq!(write["facts"]["hash_before"], Value::Null);
    assert_eq!(write["facts"]["hash_after"], sha(b"x").as_str());
    // The file sits beside the session log, where the file tools cannot write.
    let path = s.ws.join("agents/hame/sessions/default.observations.jsonl");
    assert_eq!(
        std::fs::read_to_string(&path)?
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
        2
    );
    // The text form: one line per call.
    let out = s.session("observations", &[]).await?;
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains("execute") && l.contains("\"exit_code\":3")),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn the_file_tools_cannot_write_the_observations() -> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call("c1", "execute", json!({"command": "true"})),
        ScriptStep::tool_call(
            "c2",
            "edit_file",
            json!({"file_path": "agents/hame/sessions/default.observations.jsonl", "old_string": "execute", "new_string": "nothing"}),
        ),
        ScriptStep::text("ok"),
    ])
    .await?;
    s.run_ws(&["--no-memory"], "go").await?;
    let reqs = s.server.requests();
    let refused = last_tool_result(&reqs[2].body);
    assert!(refused.contains("permission_denied"), "{refused}");
    let obs = s.session_json("observations", &[]).await?;
    assert_eq!(obs[1]["outcome"], "error");
    assert_eq!(obs[1]["code"], "permission_denied");
    Ok(())
}

#[tokio::test]
async fn an_unknown_check_is_refused_before_the_model_is_called() -> TestResult {
    let s = Scratch::scripted([ScriptStep::text("never")]).await?;
    s.write("hame.toml", TOML)?;
    let out = s
        .run_code(2, &s.ws_args(&["--verify", "tests,report"]), "go", &[])
        .await?;
    assert!(
        stderr(&out).contains("\"report\": no such check"),
        "{}",
        stderr(&out)
    );
    assert_eq!(s.server.requests().len(), 0);
    Ok(())
}

#[tokio::test]
async fn a_proposed_requirement_binds_only_once_confirmed_and_is_in_every_later_request()
-> TestResult {
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "requirement_propose",
            json!({"text": "tests must pass", "check": "tests"}),
        ),
        ScriptStep::text("noted"),
    ])
    .await?;
    s.write("hame.toml", TOML)?;
    s.write("ok.txt", "broken\n")?;
    // A candidate is not enforced: the failing check does not gate this run.
    let out = s
        .run_code(
            0,
            &s.ws_args(&["--goal", "ship v2", "--no-memory"]),
            "plan it",
            &[],
        )
        .await?;
    assert_eq!(stdout(&out), "noted\n");
    let reqs = s.server.requests();
    let system = super::common::system_of(&reqs[1].body);
    assert!(system.contains("# Task\nGoal: ship v2\n"), "{system}");
    assert!(
        system.contains(
            "candidates; not binding until confirmed):\n- rq-1: tests must pass (check `tests`)"
        ),
        "{system}"
    );
    let task = s.session_json("task", &[]).await?;
    assert_eq!(task["goal"], "ship v2");
    assert_eq!(task["requirements"][0]["status"], "candidate");
    // Confirmed by a person.
    let confirm = s
        .hame(&[
            "requirements",
            "confirm",
            "default",
            "rq-1",
            "--workspace",
            &s.ws_s,
        ])
        .await?;
    assert_eq!(confirm.status.code(), Some(0), "{}", stderr(&confirm));
    assert_eq!(stdout(&confirm), "rq-1 confirmed: tests must pass\n");
    let unknown = s
        .hame(&[
            "requirements",
            "confirm",
            "default",
            "rq-9",
            "--workspace",
            &s.ws_s,
        ])
        .await?;
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));
    // The next run (no --verify, no --goal) is gated by the confirmed requirement's check,
    // and every request carries the confirmed requirement and the goal.
    s.server
        .push_all([ScriptStep::text("done"), ScriptStep::text("still done")]);
    let out = s
        .run_code(5, &s.ws_args(&["--no-memory"]), "finish", &[])
        .await?;
    assert_eq!(stdout(&out), "still done\n");
    let reqs = s.server.requests();
    assert_eq!(reqs.len(), 4);
    for r in &reqs[2..] {
        let system = super::common::system_of(&r.body);
        assert!(system.contains("Goal: ship v2"), "{system}");
        assert!(
            system.contains(
                "Requirements (confirmed; they bind you):\n- rq-1: tests must pass (check `tests`)"
            ),
            "{system}"
        );
    }
    Ok(())
}

/// `hame sessions context S --step N --json`: every section of the request, with hash,
/// tokens and transform; the tokens add up to the provider's prompt tokens (within 5 %);
/// after compaction the replaced range is `summarised`.
#[tokio::test]
async fn the_context_manifest_lists_each_section_and_says_summarised_after_compaction() -> TestResult
{
    let summary = ScriptStep::text(
        "## Intent\nTest.\n## Progress\nNone\n## Artifacts\nNone\n## Next steps\nNone",
    )
    .when_system("You write the working summary");
    let facts = ScriptStep::text("NO_REPLY").when_system("You extract durable facts");
    let steps = std::iter::once(facts)
        .chain(std::iter::repeat_n(summary, 4))
        .chain([
            ScriptStep::tool_call("c1", "execute", json!({"command": "echo hi"})),
            ScriptStep::text("one"),
            ScriptStep::text("two"),
        ]);
    let s = Scratch::scripted(steps).await?;
    s.write(
        "AGENTS.md",
        "# Persona\nThe fact: the vault code is 4711.\n",
    )?;
    let key = [("OPENAI_API_KEY", "scripted")];
    let window = s.ws_args(&["--context-window", "12000"]);
    let long = "plenty of words here ".repeat(950);
    for (i, reply) in ["one", "two"].iter().enumerate() {
        let message = format!("{i}: {long}");
        let out = s.run_code(0, &window, &message, &key).await?;
        assert_eq!(stdout(&out).trim(), *reply);
    }
    // Request 1: the system prompt's parts, the user message, each tool schema.
    let first = s.session_json("context", &["--step", "1"]).await?;
    let sections = first["sections"].as_array().cloned().unwrap_or_default();
    let sources: Vec<&str> = sections
        .iter()
        .filter_map(|s| s["source"].as_str())
        .collect();
    for want in [
        "system:workspace",
        "system:agents_md",
        "system:session",
        "messages:0..1",
        "tool:execute",
        "tool:read_file",
    ] {
        assert!(sources.contains(&want), "{want} in {sources:?}");
    }
    // The section that carried the fact is found by its hash.
    let agents = sections
        .iter()
        .find(|s| s["source"] == "system:agents_md")
        .cloned()
        .unwrap_or_default();
    let agents_text = "<agents_md>\n# Persona\nThe fact: the vault code is 4711.\n</agents_md>\n\n";
    assert_eq!(agents["hash"], &sha(agents_text.as_bytes())[..16]);
    assert_eq!(agents["transform"], "verbatim");
    for s in &sections {
        assert!(s["tokens"].as_u64().is_some_and(|t| t > 0), "{s}");
        assert_eq!(s["hash"].as_str().map(str::len), Some(16), "{s}");
    }
    let sum: u64 = sections.iter().filter_map(|s| s["tokens"].as_u64()).sum();
    assert_eq!(first["tokens"], sum);
    let counted: u64 = sections.iter().filter_map(|s| s["counted"].as_u64()).sum();
    assert_eq!(first["counted"], counted);
    let provider = first["provider_prompt_tokens"].as_u64().unwrap_or_default();
    let off = (sum as f64 - provider as f64).abs() / provider as f64;
    assert!(
        off <= 0.05,
        "manifest {sum} vs provider {provider} tokens: {:.1} % off",
        off * 100.0
    );
    // The second call compacted the first: its request says `summarised` for the range.
    let all = s.session_json("context", &[]).await?;
    let last = all
        .as_array()
        .and_then(|a| a.last())
        .cloned()
        .unwrap_or_default();
    let summarised: Vec<&Value> = last["sections"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["transform"] == "summarised")
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(summarised.len(), 1, "{last}");
    assert!(
        summarised[0]["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("summary:0..")),
        "{last}"
    );
    assert!(
        summarised[0]["why"]
            .as_str()
            .is_some_and(|w| w.contains("compaction")),
        "{last}"
    );
    Ok(())
}

/// Over HTTP: a turn with `verify` whose check still fails answers `status: unverified`
/// with the evidence; the evidence, observations and task routes read the session; a
/// candidate requirement is confirmed over HTTP.
#[tokio::test]
async fn serve_answers_unverified_with_the_evidence_and_confirms_requirements() -> TestResult {
    use super::serve::{Serve, client};
    let s = Scratch::scripted([
        ScriptStep::tool_call(
            "c1",
            "requirement_propose",
            json!({"text": "never deploy on fridays"}),
        ),
        ScriptStep::text("done"),
        ScriptStep::text("done, again"),
    ])
    .await?;
    s.write("hame.toml", TOML)?;
    s.write("ok.txt", "broken\n")?;
    let serve = Serve::start(s.path(), &s.server.base_url(), &[])?;
    let r = client()
        .post(serve.at("/v1/sessions/h1/messages"))
        .json(&json!({"message": "fix it", "verify": ["tests"], "goal": "green tests"}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await?;
    assert_eq!(body["status"], "unverified");
    assert_eq!(body["reply"], "done, again");
    assert_eq!(body["verification"]["extra_steps"], 1);
    assert_eq!(body["verification"]["evidence"][0]["check"], "tests");
    assert_eq!(body["verification"]["evidence"][0]["outcome"], "failed");
    // An unknown check is a 400 naming the field; no turn runs.
    let before = s.server.requests().len();
    let r = client()
        .post(serve.at("/v1/sessions/h1/messages"))
        .json(&json!({"message": "again", "verify": ["nope"]}))
        .send()
        .await?;
    assert_eq!(r.status(), 400);
    assert_eq!(s.server.requests().len(), before);
    let get = |path: &str| {
        let url = serve.at(path);
        async move { client().get(url).send().await?.json::<Value>().await }
    };
    let ev = get("/v1/sessions/h1/evidence").await?;
    assert_eq!(ev["evidence"][0]["check"], "tests");
    assert_eq!(ev["evidence"][0]["stale"], false);
    let obs = get("/v1/sessions/h1/observations").await?;
    let tools: Vec<&str> = obs["observations"]
        .as_array()
        .map(|a| a.iter().filter_map(|o| o["tool"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(tools, ["requirement_propose", "verify"]);
    let task = get("/v1/sessions/h1/task").await?;
    assert_eq!(task["goal"], "green tests");
    assert_eq!(task["requirements"][0]["status"], "candidate");
    let r = client()
        .post(serve.at("/v1/sessions/h1/requirements/rq-1/confirm"))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let task = get("/v1/sessions/h1/task").await?;
    assert_eq!(task["requirements"][0]["status"], "confirmed");
    let r = client()
        .post(serve.at("/v1/sessions/h1/requirements/rq-7/confirm"))
        .send()
        .await?;
    assert_eq!(r.status(), 404);
    Ok(())
}
