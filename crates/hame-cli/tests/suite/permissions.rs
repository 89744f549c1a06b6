//! Permissions (allow / ask / deny), `hame approve` / `hame deny`, plan mode and the todo
//! list, driven through the binary against the scripted server.

use std::fs;
use std::path::Path;

use hame_test_support::ScriptStep;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::common::{Scratch, chat_ok, state_dir, stderr, stdout, system_of};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A scratch whose model answers `steps`, with `tools.json` `tj` when given.
async fn scratch(
    steps: impl IntoIterator<Item = ScriptStep>,
    tj: Option<Value>,
) -> Result<Scratch, Box<dyn std::error::Error>> {
    let s = Scratch::scripted(steps).await?;
    if let Some(t) = tj {
        s.write("tools.json", &t.to_string())?;
    }
    Ok(s)
}

/// One `hame run "go"` in a fresh workspace whose `tools.json` is `tj` (after `setup` on
/// the workspace), the model answering `steps`.
async fn run_once(
    steps: Vec<ScriptStep>,
    tj: Value,
    setup: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(Scratch, std::process::Output), Box<dyn std::error::Error>> {
    let s = scratch(steps, Some(tj)).await?;
    setup(&s.ws)?;
    let out = s.run(&s.ws_args(&[]), "go", &[]).await?;
    Ok((s, out))
}

/// `hame approve|deny --workspace <ws> <args>` in the scratch.
async fn decide(s: &Scratch, verb: &str, args: &[&str]) -> std::io::Result<std::process::Output> {
    let mut all = vec![verb, "--model", "openai:m"];
    all.extend(s.ws_args(args));
    s.hame(&all).await
}

/// The approval id of the first `approval needed:` line.
fn approval_id(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("hame: approval needed: "))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_owned)
}

/// The `permissions` state extension of session `session` (agent `hame`, no user).
async fn permission_state(s: &Scratch, session: &str) -> Result<Value, Box<dyn std::error::Error>> {
    let root = state_dir(s.path(), &s.ws).join("hame");
    let mut found = None;
    for entry in walk(&root)? {
        if entry.to_string_lossy().contains(session)
            && entry.extension().is_some_and(|e| e == "json")
        {
            found = Some(entry);
        }
    }
    let path = found.ok_or("no state file")?;
    use hame::state::StateStore as _;
    // Through the store: the document alone misses the changes in its journal.
    let v: Value = serde_json::from_slice(&fs::read(path)?)?;
    let key = hame::state::StateKey::new(
        v["agent"].as_str().unwrap_or_default(),
        v["user"].as_str(),
        v["session"].as_str().unwrap_or_default(),
    )?;
    let stored = hame::state::JsonStore::open(state_dir(s.path(), &s.ws))?
        .load(&key)
        .await?
        .ok_or("no state")?;
    Ok(stored
        .state
        .extensions
        .get("permissions")
        .cloned()
        .unwrap_or_default())
}

fn walk(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

#[tokio::test]
async fn a_deny_rule_with_a_glob_refuses_the_call_and_names_the_policy() -> TestResult {
    let tj = json!({"permissions": {"deny": ["write_file(secret/*)"]}});
    let steps = [
        ScriptStep::tool_calls(vec![
            hame_test_support::ScriptToolCall::new(
                "c1",
                "write_file",
                &json!({"file_path": "secret/key.txt", "content": "x"}),
            ),
            hame_test_support::ScriptToolCall::new(
                "c2",
                "write_file",
                &json!({"file_path": "notes.txt", "content": "ok"}),
            ),
        ]),
        ScriptStep::text("done"),
    ];
    let s = scratch(steps, Some(tj)).await?;
    let ws = &s.ws;
    s.run_ws(&[], "go").await?;
    assert!(!ws.join("secret/key.txt").exists());
    assert_eq!(fs::read_to_string(ws.join("notes.txt"))?, "ok");
    let results = s.results();
    assert!(
        results[0].contains("permission_denied")
            && results[0].contains("denied by policy (rule `deny write_file(secret/*)`)"),
        "{results:?}"
    );
    assert!(results[1].contains("Wrote"), "{results:?}");
    // Both decisions are recorded in the session state.
    let st = permission_state(&s, "default").await?;
    let outcomes: Vec<&str> = st["decisions"]
        .as_array()
        .ok_or("no decisions")?
        .iter()
        .filter_map(|d| d["outcome"].as_str())
        .collect();
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes.contains(&"deny") && outcomes.contains(&"allow"));
    Ok(())
}

#[tokio::test]
async fn ask_exits_3_then_approve_in_a_new_process_runs_the_tool() -> TestResult {
    let steps = [
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "out/a.txt", "content": "hello"}),
        ),
        ScriptStep::text("written"),
    ];
    let tj = json!({"permissions": {"ask": ["write_file(out/*)"]}});
    let s = scratch(steps, Some(tj)).await?;
    let (ws, server) = (&s.ws, &s.server);
    let args = s.ws_args(&["--session", "s1"]);
    let out = s.run_code(3, &args, "write it", &[]).await?;
    let err = stderr(&out);
    let id = approval_id(&err).ok_or(err.clone())?;
    assert!(id.starts_with("ap-"), "{err}");
    assert!(
        err.contains(&format!("approval needed: {id} write_file out/a.txt")),
        "{err}"
    );
    assert!(!ws.join("out/a.txt").exists());
    assert_eq!(server.requests().len(), 1);

    // A new run while it is pending exits 3 again with the same id, without a model call.
    let again = s.run_code(3, &args, "anything", &[]).await?;
    assert_eq!(approval_id(&stderr(&again)), Some(id.clone()));
    assert_eq!(server.requests().len(), 1);

    let ok = decide(&s, "approve", &["--session", "s1", &id]).await?;
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(stdout(&ok), "written\n");
    assert_eq!(fs::read_to_string(ws.join("out/a.txt"))?, "hello");
    assert!(s.results()[0].contains("Wrote"));

    // A second decision for the same id is refused: exit 2, one line.
    let twice = decide(&s, "deny", &["--session", "s1", &id]).await?;
    assert_eq!(twice.status.code(), Some(2));
    assert_eq!(stderr(&twice).lines().count(), 1, "{}", stderr(&twice));
    assert!(
        stderr(&twice).contains("nothing is pending"),
        "{}",
        stderr(&twice)
    );

    let st = permission_state(&s, "s1").await?;
    let by: Vec<(String, String)> = st["decisions"]
        .as_array()
        .ok_or("no decisions")?
        .iter()
        .map(|d| {
            (
                d["outcome"].as_str().unwrap_or("").to_owned(),
                d["rule"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        by,
        vec![
            ("ask".to_owned(), "ask write_file(out/*)".to_owned()),
            ("allow".to_owned(), "human".to_owned())
        ]
    );
    Ok(())
}

#[tokio::test]
async fn ask_then_deny_gives_the_model_a_denied_result() -> TestResult {
    let steps = [
        ScriptStep::tool_call("c1", "execute", json!({"command": "rm -rf data"})),
        ScriptStep::text("ok, I will not"),
    ];
    let tj = json!({"permissions": {"ask": ["execute(rm *)"]}});
    let s = scratch(steps, Some(tj)).await?;
    let ws = &s.ws;
    fs::create_dir_all(ws.join("data"))?;
    let out = s.run_code(3, &s.ws_args(&[]), "clean up", &[]).await?;
    assert!(
        stderr(&out).contains("execute rm -rf data"),
        "{}",
        stderr(&out)
    );

    // An unknown id: exit 2, one line; nothing changes.
    let bad = decide(&s, "approve", &["ap-000000000000"]).await?;
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(stderr(&bad).lines().count(), 1, "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("unknown approval id"),
        "{}",
        stderr(&bad)
    );
    assert!(ws.join("data").is_dir());

    // Without an id, the only pending call is decided.
    let no = decide(&s, "deny", &["--reason", "keep the data"]).await?;
    assert_eq!(no.status.code(), Some(0), "{}", stderr(&no));
    assert_eq!(stdout(&no), "ok, I will not\n");
    assert!(ws.join("data").is_dir());
    let r = &s.results()[0];
    assert!(
        r.contains("permission_denied") && r.contains("denied by the user: keep the data"),
        "{r}"
    );

    // Nothing pending now: a clear message, exit 2.
    let none = decide(&s, "approve", &[]).await?;
    assert_eq!(none.status.code(), Some(2));
    assert!(
        stderr(&none).contains("nothing is pending in session default"),
        "{}",
        stderr(&none)
    );
    Ok(())
}

#[tokio::test]
async fn plan_mode_blocks_writes_and_the_shell_until_the_plan_is_approved() -> TestResult {
    let s = scratch(
        [
            ScriptStep::tool_calls(vec![
                hame_test_support::ScriptToolCall::new(
                    "c1",
                    "write_file",
                    &json!({"file_path": "a.txt", "content": "x"}),
                ),
                hame_test_support::ScriptToolCall::new(
                    "c2",
                    "execute",
                    &json!({"command": "touch b.txt"}),
                ),
                hame_test_support::ScriptToolCall::new(
                    "c3",
                    "read_file",
                    &json!({"file_path": "notes.md"}),
                ),
            ]),
            ScriptStep::tool_call(
                "c4",
                "plan_write",
                json!({"content": "# Plan\n1. write a.txt\n"}),
            ),
            ScriptStep::tool_call("c5", "plan_exit", json!({"summary": "write a.txt"})),
            ScriptStep::tool_call(
                "c6",
                "write_file",
                json!({"file_path": "a.txt", "content": "x"}),
            ),
            ScriptStep::text("built"),
        ],
        None,
    )
    .await?;
    let ws = &s.ws;
    s.write("notes.md", "the notes")?;
    let plan = s.ws_args(&["--plan"]);
    let out = s.run_code(3, &plan, "plan then build", &[]).await?;
    let err = stderr(&out);
    assert!(err.contains("plan_exit"), "{err}");
    let id = approval_id(&err).ok_or(err.clone())?;
    let reqs = s.server.requests();
    // Plan mode is in the prompt; the plan tools are offered.
    assert!(system_of(&reqs[0].body).contains("# Plan mode"));
    let names = super::common::tool_names(&reqs[0].body);
    for t in ["plan_enter", "plan_write", "plan_exit", "todo_write"] {
        assert!(names.contains(&t.to_owned()), "{names:?}");
    }
    let results = s.results();
    assert!(
        results[0].contains("plan mode") && results[0].contains("permission_denied"),
        "{results:?}"
    );
    assert!(results[1].contains("plan mode"), "{results:?}");
    assert!(results[2].contains("the notes"), "{results:?}");
    assert!(!ws.join("a.txt").exists() && !ws.join("b.txt").exists());
    assert_eq!(
        fs::read_to_string(ws.join("plans/PLAN.md"))?,
        "# Plan\n1. write a.txt\n"
    );
    assert_eq!(
        permission_state(&s, "default").await?["plan_mode"],
        json!(true)
    );

    let ok = decide(&s, "approve", &[&id]).await?;
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(stdout(&ok), "built\n");
    assert_eq!(fs::read_to_string(ws.join("a.txt"))?, "x");
    let reqs = s.server.requests();
    assert!(!system_of(&reqs[reqs.len() - 1].body).contains("# Plan mode"));
    assert_eq!(
        permission_state(&s, "default").await?["plan_mode"],
        json!(false)
    );
    Ok(())
}

#[tokio::test]
async fn plan_mode_reaches_subagents() -> TestResult {
    const PARENT: &str = "Available subagents:";
    const CHILD: &str = "## Subagent context";
    let s = scratch(
        [
            ScriptStep::tool_call(
                "c1",
                "agent_spawn",
                json!({"agent_id": "general-purpose", "task": "write a.txt"}),
            )
            .when_system(PARENT),
            ScriptStep::tool_call(
                "k1",
                "write_file",
                json!({"file_path": "a.txt", "content": "x"}),
            )
            .when_system(CHILD),
            ScriptStep::text("I could not write").when_system(CHILD),
            ScriptStep::text("the child could not write").when_system(PARENT),
        ],
        None,
    )
    .await?;
    s.run_ws(&["--plan"], "go").await?;
    assert!(!s.ws.join("a.txt").exists());
    let child_result = s
        .server
        .requests()
        .iter()
        .filter(|r| system_of(&r.body).contains(CHILD))
        .filter_map(|r| super::common::last_tool_result(&r.body).into())
        .find(|t: &String| !t.is_empty())
        .unwrap_or_default();
    assert!(child_result.contains("plan mode"), "{child_result}");
    Ok(())
}

#[tokio::test]
async fn the_todo_list_persists_and_is_shown_every_step() -> TestResult {
    let s = scratch(
        [
        ScriptStep::tool_call(
            "c1",
            "todo_write",
            json!({"todos": [{"content": "read the notes", "status": "completed"}, {"content": "write the summary", "status": "in_progress"}]}),
        ),
        ScriptStep::text("listed"),
        ScriptStep::tool_call(
            "c2",
            "todo_write",
            json!({"todos": [{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}]}),
        ),
        ScriptStep::text("second"),
        ],
        None,
    )
    .await?;
    s.run_ws(&[], "plan it").await?;
    s.run_ws(&[], "next").await?;
    let reqs = s.server.requests();
    // Shown in the step after the write, and in the next process's first request.
    for i in [1, 2, 3] {
        let sys = system_of(&reqs[i].body);
        assert!(
            sys.contains(
                "# Todo list\n- [x] read the notes\n- [~] write the summary (in progress)"
            ),
            "request {i}: {sys}"
        );
    }
    // Two in_progress items are refused; the list is unchanged.
    assert!(
        s.results()
            .last()
            .is_some_and(|r| r.contains("at most one item may be in_progress"))
    );
    let st = permission_state(&s, "default").await?;
    assert_eq!(
        st["todos"][1],
        json!({"content": "write the summary", "status": "in_progress"})
    );
    Ok(())
}

#[tokio::test]
async fn chat_asks_inline_and_runs_the_call_on_yes() -> TestResult {
    let steps = [
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "a.txt", "content": "yes"}),
        ),
        ScriptStep::text("wrote it"),
        ScriptStep::tool_call(
            "c2",
            "write_file",
            json!({"file_path": "b.txt", "content": "no"}),
        ),
        ScriptStep::text("did not"),
    ];
    let tj = json!({"permissions": {"ask": ["write_file"]}});
    let s = scratch(steps, Some(tj)).await?;
    let ws = &s.ws;
    let input = b"write a\ny\nwrite b\nn\n";
    let out = chat_ok(s.path(), &s.server.base_url(), &s.ws_s, input).await?;
    let err = stderr(&out);
    assert!(err.contains("allow write_file a.txt? [y/N"), "{err}");
    assert_eq!(fs::read_to_string(ws.join("a.txt"))?, "yes");
    assert!(!ws.join("b.txt").exists());
    let o = stdout(&out);
    assert!(o.contains("wrote it") && o.contains("did not"), "{o}");
    assert!(
        s.results()
            .last()
            .is_some_and(|r| r.contains("denied by the user"))
    );
    Ok(())
}

/// Issue #30, item 1: with `deny edit_file(config/prod.yaml)` and `deny write_file(*.env)`,
/// every spelling the file tools accept for those files is denied and nothing is written;
/// a `..` spelling is refused before any rule, as the tool refuses it.
#[tokio::test]
async fn hostile_spellings_of_a_denied_path_are_denied_and_nothing_is_written() -> TestResult {
    let call = hame_test_support::ScriptToolCall::new;
    let edit = |p: &str| json!({"file_path": p, "old_string": "original", "new_string": "pwned"});
    let env_file = |p: &str| json!({"file_path": p, "content": "SECRET=1"});
    let steps = vec![
        ScriptStep::tool_calls(vec![
            call("c1", "edit_file", &edit("config//prod.yaml")),
            call("c2", "edit_file", &edit("config/./prod.yaml")),
            call("c3", "edit_file", &edit("config/prod.yaml/")),
            call("c4", "edit_file", &edit("/./config/prod.yaml")),
            call("c5", "edit_file", &edit("config/../config/prod.yaml")),
            call("c6", "write_file", &env_file("a.env/")),
            call("c7", "write_file", &env_file("dir//b.env")),
        ]),
        ScriptStep::text("done"),
    ];
    let tj = json!({"permissions": {"deny": ["edit_file(config/prod.yaml)", "write_file(*.env)"]}});
    let (s, out) = run_once(steps, tj, |ws| {
        fs::create_dir_all(ws.join("config"))?;
        fs::write(ws.join("config/prod.yaml"), "original")
    })
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ws = &s.ws;
    assert_eq!(fs::read_to_string(ws.join("config/prod.yaml"))?, "original");
    assert!(!ws.join("a.env").exists() && !ws.join("dir/b.env").exists());
    let results = s.results();
    assert_eq!(results.len(), 7, "{results:?}");
    for (i, r) in results.iter().enumerate() {
        let expected = if i == 4 {
            "invalid_path"
        } else {
            "permission_denied"
        };
        assert!(r.contains(expected), "call {}: {r}", i + 1);
    }
    // The denial names the file that would have been touched.
    assert!(
        results[0].contains("`edit_file` (config/prod.yaml) was denied by policy"),
        "{}",
        results[0]
    );
    Ok(())
}

/// The same spellings meet `ask` rules: the call is suspended, nothing is written.
#[tokio::test]
async fn hostile_spellings_of_an_asked_path_are_suspended() -> TestResult {
    for spelling in ["out//a.txt", "./out/./a.txt", "out/a.txt/"] {
        let steps = vec![
            ScriptStep::tool_call(
                "c1",
                "write_file",
                json!({"file_path": spelling, "content": "hello"}),
            ),
            ScriptStep::text("written"),
        ];
        let tj = json!({"permissions": {"ask": ["write_file(out/*)"]}});
        let (s, out) = run_once(steps, tj, |_| Ok(())).await?;
        assert_eq!(out.status.code(), Some(3), "{spelling}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("write_file out/a.txt (rule `ask write_file(out/*)`)"),
            "{spelling}: {}",
            stderr(&out)
        );
        assert!(!s.ws.join("out/a.txt").exists(), "{spelling}");
    }
    Ok(())
}

/// Issue #30, item 13: `a` to a call an `ask` rule stopped sticks: the next identical call
/// (same tool, same file, however spelled) runs without asking.
#[tokio::test]
async fn chat_always_under_an_ask_rule_does_not_ask_again() -> TestResult {
    let edit = |p: &str, old: &str, new: &str| json!({"file_path": p, "old_string": old, "new_string": new});
    let steps = [
        ScriptStep::tool_call("c1", "edit_file", edit("notes.md", "v1", "v2")),
        ScriptStep::text("first"),
        ScriptStep::tool_call("c2", "edit_file", edit("notes.md", "v2", "v3")),
        ScriptStep::text("second"),
        ScriptStep::tool_call("c3", "edit_file", edit("./notes.md", "v3", "v4")),
        ScriptStep::text("third"),
    ];
    let tj = json!({"permissions": {"ask": ["edit_file(notes.md)"]}});
    let s = scratch(steps, Some(tj)).await?;
    let ws = &s.ws;
    s.write("notes.md", "v1")?;
    // One answer only: a second question would read "edit again" as a no.
    let input = b"edit once\na\nedit again\nand again\n";
    let out = chat_ok(s.path(), &s.server.base_url(), &s.ws_s, input).await?;
    let err = stderr(&out);
    assert_eq!(err.matches("allow edit_file notes.md?").count(), 1, "{err}");
    assert_eq!(fs::read_to_string(ws.join("notes.md"))?, "v4");
    let o = stdout(&out);
    assert!(
        o.contains("first") && o.contains("second") && o.contains("third"),
        "{o}"
    );
    Ok(())
}
