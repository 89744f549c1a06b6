//! Skills through `hame run` and `hame skills`: the prompt lists names and descriptions,
//! `load_skill` returns the body and resources, layers, live edits, invalid front matter,
//! drafts, promotion and the curator.

use std::fs;
use std::path::Path;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{
    Scratch, hame, output, prompt_of, run_script, run_with, stderr, stdout, system_of, tool_names,
    tool_results, warnings,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn skill(root: &Path, name: &str, text: &str) -> std::io::Result<()> {
    fs::create_dir_all(root.join(name))?;
    fs::write(root.join(name).join("SKILL.md"), text)
}

/// One [`skill`] under `root` for each `(name, text)`.
fn skills(root: &Path, each: &[(&str, &str)]) -> std::io::Result<()> {
    each.iter()
        .try_for_each(|(name, text)| skill(root, name, text))
}

/// `hame skills promote <name>` for user alice of the scratch's workspace.
async fn promote_for_alice(s: &Scratch, name: &str) -> std::io::Result<std::process::Output> {
    let args = ["promote", name, "--workspace", &s.ws_s, "--user", "alice"];
    skills_cmd(s.path(), &args).await
}

/// `hame skills <args>` in `dir`, returning the output.
async fn skills_cmd(dir: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    let state = dir.join("state").to_string_lossy().into_owned();
    let mut all = vec!["skills"];
    all.extend_from_slice(args);
    output(hame(&all, &[("HAME_STATE_HOME", &state)], dir)).await
}

#[tokio::test]
async fn skills_are_listed_without_bodies_and_loaded_with_their_resources() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    let global = dir.path().join("global-skills");
    skill(
        &ws.join("skills"),
        "review",
        "---\ndescription: Reviews a patch for style and bugs.\n---\n# Review\nBODY-REVIEW: read the diff first.\n",
    )?;
    fs::create_dir_all(ws.join("skills/review/references"))?;
    fs::write(ws.join("skills/review/references/guide.md"), "GUIDE-TEXT")?;
    fs::create_dir_all(ws.join("skills/review/scripts"))?;
    fs::write(ws.join("skills/review/scripts/check.sh"), "echo checked")?;
    // The global layer: `review` is shadowed by the workspace, `deploy` stacks.
    skill(
        &global,
        "review",
        "---\ndescription: GLOBAL review.\n---\nBODY-GLOBAL\n",
    )?;
    skill(
        &global,
        "deploy",
        "---\nname: deploy\ndescription: Deploys the service.\n---\nBODY-DEPLOY\n",
    )?;
    fs::write(global.join("deploy/notes.md"), "DEPLOY-NOTES")?;

    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call("c1", "load_skill", json!({"name": "review"})),
        ScriptStep::tool_call(
            "c2",
            "read_file",
            json!({"file_path": "skills/review/references/guide.md"}),
        ),
        ScriptStep::tool_call(
            "c3",
            "load_skill",
            json!({"name": "deploy", "path": "notes.md"}),
        ),
        ScriptStep::tool_call(
            "c4",
            "execute",
            json!({"command": "sh skills/review/scripts/check.sh"}),
        ),
        ScriptStep::tool_call("c5", "load_skill", json!({"name": "nope"})),
        ScriptStep::text("done"),
    ]);
    let (ws_s, global_s) = (
        ws.to_string_lossy().into_owned(),
        global.to_string_lossy().into_owned(),
    );
    let out = run_with(
        dir.path(),
        &server.base_url(),
        &[
            "--workspace",
            &ws_s,
            "--skills-dir",
            &global_s,
            "--no-memory",
        ],
        "review my patch",
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reqs = server.requests();
    let system = system_of(&reqs[0].body);
    assert!(
        system.contains("<available_skills>")
            && system.contains(
                "- deploy: Deploys the service.\n- review: Reviews a patch for style and bugs.\n"
            ),
        "{system}"
    );
    for body in ["BODY-REVIEW", "BODY-GLOBAL", "BODY-DEPLOY", "GLOBAL review"] {
        assert!(!system.contains(body), "{body} in the prompt: {system}");
    }
    assert!(tool_names(&reqs[0].body).contains(&"load_skill".to_string()));
    let results = tool_results(server);
    assert!(
        results[0].contains("BODY-REVIEW: read the diff first."),
        "{}",
        results[0]
    );
    assert!(
        results[0].contains("- skills/review/references/guide.md"),
        "{}",
        results[0]
    );
    assert!(
        results[0].contains("sh skills/review/scripts/check.sh"),
        "{}",
        results[0]
    );
    assert!(results[1].contains("GUIDE-TEXT"), "{}", results[1]);
    assert_eq!(results[2], "DEPLOY-NOTES");
    assert!(results[3].contains("checked"), "{}", results[3]);
    assert!(
        results[4].contains("no skill named `nope`; available: deploy, review"),
        "{}",
        results[4]
    );

    // `hame skills list` shows the same, with layers and states.
    let list = skills_cmd(
        dir.path(),
        &[
            "list",
            "--workspace",
            &ws_s,
            "--skills-dir",
            &global_s,
            "--json",
        ],
    )
    .await?;
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    let v: serde_json::Value = serde_json::from_str(&stdout(&list))?;
    let rows: Vec<(String, String, String)> = v["skills"]
        .as_array()
        .ok_or("skills")?
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["layer"].as_str().unwrap_or_default().to_owned(),
                s["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("deploy".into(), "global".into(), "active".into()),
            ("review".into(), "workspace".into(), "active".into())
        ]
    );
    Ok(())
}

#[tokio::test]
async fn per_user_layer_and_live_edits_show_on_the_next_step() -> TestResult {
    let s = Scratch::new().await?;
    let ws = &s.ws;
    skill(
        &ws.join("skills"),
        "review",
        "---\ndescription: Shared review.\n---\nSHARED\n",
    )?;
    skills(
        &ws.join("alice/skills"),
        &[
            ("review", "---\ndescription: Alice's review.\n---\nALICE\n"),
            (
                "private",
                "---\ndescription: Only for alice.\n---\nPRIVATE\n",
            ),
        ],
    )?;

    // Alice: her layer wins the name, her unique skill stacks; a skill written during the
    // call is listed on the next step.
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "write_file",
            json!({"file_path": "skills/fresh/SKILL.md", "content": "---\ndescription: Written just now.\n---\nFRESH\n"}),
        ),
        ScriptStep::tool_call("c2", "load_skill", json!({"name": "review"})),
        ScriptStep::text("ok"),
    ]);
    s.run_ws(&["--user", "alice"], "hi").await?;
    let reqs = server.requests();
    let first = system_of(&reqs[0].body);
    assert!(
        first.contains("- private: Only for alice.\n- review: Alice's review.\n"),
        "{first}"
    );
    assert!(!first.contains("fresh"), "{first}");
    let second = system_of(&reqs[1].body);
    assert!(second.contains("- fresh: Written just now.\n"), "{second}");
    let results = tool_results(server);
    assert!(
        results[1].contains("ALICE") && results[1].contains("layer=\"user\""),
        "{}",
        results[1]
    );

    // Bob sees the shared layer only: never alice's skills (the scratch's server, which
    // `run_ws` points at; Alice's requests come first).
    let alices = server.requests().len();
    server.push_all([
        ScriptStep::tool_call("c1", "load_skill", json!({"name": "private"})),
        ScriptStep::text("ok"),
    ]);
    s.run_ws(&["--user", "bob"], "hi").await?;
    let system = system_of(&server.requests()[alices].body);
    assert!(
        system.contains("- fresh: Written just now.\n- review: Shared review.\n"),
        "{system}"
    );
    assert!(
        !system.contains("alice") && !system.contains("Only for alice"),
        "{system}"
    );
    let results = tool_results(server);
    assert!(
        results[0].contains("no skill named `private`"),
        "{}",
        results[0]
    );
    assert!(!results[0].contains("PRIVATE"), "{}", results[0]);
    Ok(())
}

#[tokio::test]
async fn invalid_front_matter_is_skipped_with_one_warning() -> TestResult {
    let s = Scratch::new().await?;
    let ws = &s.ws;
    skills(
        &ws.join("skills"),
        &[
            ("good", "---\ndescription: A good one.\n---\nGOOD\n"),
            ("bad", "---\ndescription: [unclosed\n---\nBAD\n"),
            ("bare", "no front matter at all\n"),
        ],
    )?;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call("c1", "list_files", json!({"path": "skills"})),
        ScriptStep::tool_call("c2", "list_files", json!({"path": "skills"})),
        ScriptStep::text("ok"),
    ]);
    let out = s.run_ws(&[], "hi").await?;
    assert_eq!(stdout(&out), "ok\n");
    let err = stderr(&out);
    let warnings = warnings(&out);
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("skills/bad/SKILL.md") && l.contains("front matter")),
        "{err}"
    );
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("skills/bare/SKILL.md") && l.contains("no front matter")),
        "{err}"
    );
    for req in server.requests() {
        let system = system_of(&req.body);
        assert!(system.contains("- good: A good one.\n"), "{system}");
        assert!(
            !system.contains("- bad") && !system.contains("- bare"),
            "{system}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn drafts_are_hidden_until_promoted_and_the_curator_ages_them() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    let ws_s = &s.ws_s;
    let server = &s.server;
    server.push_all([
        ScriptStep::tool_call(
            "c1",
            "propose_skill",
            json!({"name": "summarize", "description": "Summarise a long log.\nname: injected", "body": "1. Read the tail.\n2. Group errors."}),
        ),
        ScriptStep::text("saved"),
    ]);
    s.run_ws(&["--user", "alice"], "learn").await?;
    let results = tool_results(server);
    assert!(
        results[0].contains("alice/skills/_drafts/summarize/SKILL.md"),
        "{}",
        results[0]
    );
    let draft = fs::read_to_string(ws.join("alice/skills/_drafts/summarize/SKILL.md"))?;
    assert!(draft.contains("1. Read the tail."), "{draft}");
    // The description stays one value: it cannot add a key to the front matter.
    let doc = hame::skills::parse_skill("summarize", &draft).map_err(|e| e.to_string())?;
    assert_eq!(doc.name, "summarize");
    assert_eq!(doc.description, "Summarise a long log. name: injected");

    // Not listed to the model while a draft.
    let prompt = prompt_of(dir.path(), &["--workspace", ws_s, "--user", "alice"]).await?;
    assert!(!prompt.contains("summarize"), "{prompt}");

    let list = |args: Vec<&'static str>| {
        let dir = dir.path().to_path_buf();
        let ws_s = ws_s.clone();
        async move {
            let mut all = vec!["list", "--json", "--workspace"];
            all.push(Box::leak(ws_s.into_boxed_str()));
            all.extend(args);
            let out = skills_cmd(&dir, &all).await?;
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            let v: serde_json::Value = serde_json::from_str(&stdout(&out))?;
            Ok::<_, Box<dyn std::error::Error>>(v)
        }
    };
    let v = list(vec!["--user", "alice"]).await?;
    assert_eq!(v["skills"][0]["state"], "draft", "{v}");
    assert_eq!(v["skills"][0]["layer"], "user", "{v}");
    // Bob does not see alice's draft.
    assert_eq!(list(vec!["--user", "bob"]).await?["skills"], json!([]));

    // Promotion: the draft moves to alice's layer and is listed from the next call on.
    let bad = promote_for_alice(&s, "nope").await?;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("summarize"), "{}", stderr(&bad));
    let out = promote_for_alice(&s, "summarize").await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ws.join("alice/skills/summarize/SKILL.md").is_file());
    assert!(!ws.join("alice/skills/_drafts/summarize").exists());
    let v = list(vec!["--user", "alice"]).await?;
    assert_eq!(
        (
            v["skills"][0]["state"].as_str(),
            v["skills"][0]["layer"].as_str()
        ),
        (Some("active"), Some("user")),
        "{v}"
    );
    let prompt = prompt_of(dir.path(), &["--workspace", ws_s, "--user", "alice"]).await?;
    assert!(
        prompt.contains("- summarize: Summarise a long log. name: injected\n"),
        "{prompt}"
    );

    // The curator: unused for 30 days → stale (still listed), 90 days → archived (hidden,
    // kept on disk); promote restores it.
    let usage_path = ws.join("alice/skills/.usage.json");
    let age = |days: i64| -> std::io::Result<()> {
        let when = (chrono::Utc::now() - chrono::Duration::days(days)).to_rfc3339();
        fs::write(
            &usage_path,
            json!({"skills": {"summarize": {"created": when, "promoted": when}}}).to_string(),
        )
    };
    age(40)?;
    assert_eq!(
        list(vec!["--user", "alice"]).await?["skills"][0]["state"],
        "stale"
    );
    age(100)?;
    assert_eq!(
        list(vec!["--user", "alice"]).await?["skills"][0]["state"],
        "archived"
    );
    let prompt = prompt_of(dir.path(), &["--workspace", ws_s, "--user", "alice"]).await?;
    assert!(!prompt.contains("summarize"), "{prompt}");
    assert!(
        ws.join("alice/skills/summarize/SKILL.md").is_file(),
        "never deleted"
    );
    let out = promote_for_alice(&s, "summarize").await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        list(vec!["--user", "alice"]).await?["skills"][0]["state"],
        "active"
    );
    Ok(())
}

#[tokio::test]
async fn a_skills_dir_that_is_not_a_directory_is_exit_2_and_list_prints_lines() -> TestResult {
    let s = Scratch::new().await?;
    let (dir, ws) = (&s.dir, &s.ws);
    skills(
        &ws.join("skills"),
        &[
            ("review", "---\ndescription: Reviews.\n---\nBODY\n"),
            ("broken", "---\nname: [x\n---\n"),
        ],
    )?;
    let ws_s = &s.ws_s;
    let missing = dir.path().join("nope").to_string_lossy().into_owned();
    let (out, server) = run_script(
        dir.path(),
        &["--workspace", ws_s, "--skills-dir", &missing],
        "hi",
        vec![ScriptStep::text("never")],
        &[],
    )
    .await?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("--skills-dir"), "{}", stderr(&out));
    assert_eq!(server.request_count(), 0);
    let list = skills_cmd(dir.path(), &["list", "--workspace", ws_s]).await?;
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    assert_eq!(
        stdout(&list),
        "review\tworkspace\tactive\tworkspace\t-\tReviews.\n"
    );
    assert!(
        stderr(&list).contains("skills/broken/SKILL.md skipped"),
        "{}",
        stderr(&list)
    );
    Ok(())
}

/// Runs `git` in `dir` with a fixed identity; its trimmed stdout.
fn git(dir: &Path, args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    Ok(hame_test_env::git(dir, args)?)
}

/// Issue 35, item 3, as a user: a skill pushed to a Git repository (`file://`) shows in
/// the next `hame run`, its `load_skill` result (in the session log) names the commit,
/// `hame skills list` shows source and version, and a user's own skill of that name
/// shadows it.
#[tokio::test]
async fn a_git_repository_skill_shows_in_the_next_run_pinned_to_its_commit() -> TestResult {
    if std::process::Command::new("git")
        .arg("--version")
        .output()
        .is_err()
    {
        hame_test_env::skip("no git program");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let origin = dir.path().join("origin.git");
    let work = dir.path().join("work");
    git(
        dir.path(),
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            &origin.to_string_lossy(),
        ],
    )?;
    git(
        dir.path(),
        &["init", "-q", "-b", "main", &work.to_string_lossy()],
    )?;
    git(
        &work,
        &["remote", "add", "origin", &origin.to_string_lossy()],
    )?;
    let push = |body: &str| -> Result<String, Box<dyn std::error::Error>> {
        fs::create_dir_all(work.join("skills/deploy"))?;
        fs::write(
            work.join("skills/deploy/SKILL.md"),
            format!("---\ndescription: Deploys the service.\n---\n{body}\n"),
        )?;
        git(&work, &["add", "-A"])?;
        git(&work, &["commit", "-q", "-m", body])?;
        git(&work, &["push", "-q", "origin", "main"])?;
        git(&work, &["rev-parse", "HEAD"])
    };
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    fs::write(
        ws.join("hame.toml"),
        format!(
            "[skills]\nrefresh = 1\n[[skills.repository]]\ngit = \"file://{}\"\nref = \"main\"\npath = \"skills\"\n",
            origin.display()
        ),
    )?;
    let ws_s = ws.to_string_lossy().into_owned();
    let run = |extra: &'static [&'static str]| {
        let dir = dir.path().to_path_buf();
        let ws_s = ws_s.clone();
        async move {
            let server = ScriptedServer::start().await?;
            server.push_all([
                ScriptStep::tool_call("c1", "load_skill", json!({"name": "deploy"})),
                ScriptStep::text("done"),
            ]);
            let mut args = vec!["--workspace", ws_s.as_str(), "--all-tools"];
            args.extend_from_slice(extra);
            let out = run_with(&dir, &server.base_url(), &args, "deploy it", &[]).await?;
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            let reqs = server.requests();
            let system = system_of(&reqs[0].body);
            let result = super::common::last_tool_result(&reqs[1].body);
            Ok::<_, Box<dyn std::error::Error>>((system, result))
        }
    };
    let first = push("FIRST-BODY")?;
    let (system, result) = run(&[]).await?;
    assert!(system.contains("deploy: Deploys the service."), "{system}");
    assert!(result.contains("FIRST-BODY"), "{result}");
    assert!(
        result.contains(&format!(
            "layer=\"repository\" source=\"git file://{}@main:skills\" version=\"{first}\"",
            origin.display()
        )),
        "{result}"
    );
    // The session log (as `hame sessions show` prints it) names the commit.
    let state = dir.path().join("state").to_string_lossy().into_owned();
    let shown = output(hame(
        &["sessions", "show", "default", "--workspace", &ws_s],
        &[("HAME_STATE_HOME", &state)],
        dir.path(),
    ))
    .await?;
    assert!(
        stdout(&shown).contains(&format!("version=\\\"{first}\\\""))
            || stdout(&shown).contains(&format!("version=\"{first}\"")),
        "the session log names the commit: {}{}",
        stdout(&shown),
        stderr(&shown)
    );

    let second = push("SECOND-BODY")?;
    let (_, result) = run(&[]).await?;
    assert!(
        result.contains("SECOND-BODY") && result.contains(&second),
        "{result}"
    );

    let list = skills_cmd(dir.path(), &["list", "--workspace", &ws_s]).await?;
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    assert_eq!(
        stdout(&list),
        format!(
            "deploy\trepository\tactive\tgit file://{}@main:skills\t{second}\tDeploys the service.\n",
            origin.display()
        )
    );

    // A user's own `deploy` shadows the repository's.
    skill(
        &ws.join("alice/skills"),
        "deploy",
        "---\ndescription: Deploys (alice).\n---\nALICE-BODY\n",
    )?;
    let (_, result) = run(&["--user", "alice"]).await?;
    assert!(
        result.contains("ALICE-BODY") && !result.contains("version="),
        "{result}"
    );
    Ok(())
}
