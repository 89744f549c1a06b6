//! `hame run --sandbox docker` against a real engine (`HAME_TEST_DOCKER=1`), as a user
//! drives it: files stay in the container, nothing lands in the host workspace, the state
//! comes back in a new process after the containers are gone, scopes stay apart, the
//! projection follows the host, and no container outlives hame.

use std::fs;
use std::path::Path;
use std::process::Command;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::common::{Scratch, service, stderr, stdout, system_of, tool_results, unique_agent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Containers of `agent` that exist now (running or not).
fn containers_of(agent: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=hame.sandbox",
            "--format",
            "{{.Label \"hame.sandbox.scope\"}}",
        ])
        .output();
    let Ok(out) = out else {
        panic!("`docker ps` failed: {out:?}");
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("agents/{agent}/")))
        .map(str::to_owned)
        .collect()
}

/// Every file of the host workspace, relative, sorted.
fn host_files(ws: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![ws.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(ws) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The output of the last `execute` result (without its exit-code footer).
fn last_exec(server: &ScriptedServer) -> String {
    let last = tool_results(server).last().cloned().unwrap_or_default();
    last.strip_suffix("\n[exit code 0]")
        .unwrap_or(&last)
        .to_owned()
}

fn exec(id: &str, command: &str) -> ScriptStep {
    ScriptStep::tool_call(id, "execute", json!({ "command": command }))
}

/// `--workspace <ws> --agent <agent> <extra...> --sandbox docker`.
fn docker<'a>(s: &'a Scratch, agent: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut all = s.ws_args(&["--agent", agent]);
    all.extend_from_slice(extra);
    all.extend(["--sandbox", "docker"]);
    all
}

/// A scratch for `agent` when Docker is there (else `None`, the test skipped).
async fn docker_scratch() -> Result<Option<(Scratch, String)>, Box<dyn std::error::Error>> {
    if service("HAME_TEST_DOCKER").is_none() {
        return Ok(None);
    }
    Ok(Some((Scratch::new().await?, unique_agent())))
}

#[tokio::test]
async fn files_stay_in_the_sandbox_and_come_back_in_a_new_process() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    let (server, ws) = (&s.server, &s.ws);
    s.write("AGENTS.md", "persona v1\n")?;
    s.write("skills/old/SKILL.md", "old skill\n")?;
    let secret = [("OPENAI_API_KEY", "sk-test-secret-123")];
    let args = docker(&s, &agent, &["--user", "alice", "--session", "s1"]);

    // Call 1: a file tool and the shell, both in the container.
    server.push_all([
        ScriptStep::tool_call("c1", "write_file", json!({"file_path": "notes.md", "content": "kept\n"})),
        exec("c2", "cat notes.md; pwd; id -u; env | grep -c sk-test || true; ls /sys/class/net; cat AGENTS.md; ls skills"),
        ScriptStep::text("done"),
    ]);
    let out = s.run_code(0, &args, "go", &secret).await?;
    assert_eq!(stdout(&out), "done\n");
    assert_eq!(
        last_exec(server),
        "kept\n/workspace\n1000\n0\nlo\npersona v1\nold\n"
    );
    let system = system_of(&server.requests()[0].body);
    assert!(
        system.contains("You run sandboxed") && system.contains("/workspace"),
        "{system}"
    );
    assert!(
        !system.contains(&s.ws_s),
        "the prompt never names the host path"
    );
    assert_eq!(
        host_files(ws),
        vec!["AGENTS.md", "skills/old/SKILL.md"],
        "nothing written into the host workspace"
    );
    assert!(
        containers_of(&agent).is_empty(),
        "no container outlives hame"
    );

    // The host edits AGENTS.md and deletes a skill; call 2 in a new process sees the
    // restored notes and the new projection.
    s.write("AGENTS.md", "persona v2\n")?;
    fs::remove_dir_all(ws.join("skills/old"))?;
    s.write("skills/new/SKILL.md", "new skill\n")?;
    server.push_all([
        exec("c3", "cat notes.md AGENTS.md; ls skills"),
        ScriptStep::text("again"),
    ]);
    s.run_code(0, &args, "again", &secret).await?;
    assert_eq!(last_exec(server), "kept\npersona v2\nnew\n");

    // User scope (the default): another session of alice shares the sandbox state ...
    let other_session = docker(&s, &agent, &["--user", "alice", "--session", "s2"]);
    server.push_all([exec("c4", "cat notes.md"), ScriptStep::text("shared")]);
    s.run_code(0, &other_session, "x", &[]).await?;
    assert_eq!(last_exec(server), "kept\n");
    // ... session scope does not, and neither does another user.
    let session_scope = docker(
        &s,
        &agent,
        &[
            "--user",
            "alice",
            "--session",
            "s3",
            "--isolation",
            "session",
        ],
    );
    server.push_all([exec("c5", "ls"), ScriptStep::text("fresh")]);
    s.run_code(0, &session_scope, "x", &[]).await?;
    assert_eq!(last_exec(server), "AGENTS.md\nskills\n");
    server.push_all([
        exec("c6", "cat notes.md 2>&1 | grep -c 'No such'"),
        ScriptStep::text("bob"),
    ]);
    s.run_code(0, &docker(&s, &agent, &["--user", "bob"]), "x", &[])
        .await?;
    assert_eq!(last_exec(server), "1\n");

    assert_eq!(host_files(ws), vec!["AGENTS.md", "skills/new/SKILL.md"]);
    assert!(
        containers_of(&agent).is_empty(),
        "no container outlives hame"
    );
    Ok(())
}

#[tokio::test]
async fn docker_down_is_a_one_line_configuration_error() -> TestResult {
    let s = Scratch::new().await?;
    let down = [("DOCKER_HOST", "unix:///nonexistent/docker.sock")];
    let out = s
        .run_code(2, &s.ws_args(&["--sandbox", "docker"]), "hi", &down)
        .await?;
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("Docker engine is not reachable"), "{err}");
    assert!(s.server.requests().is_empty(), "no model call");
    s.run_code(2, &s.ws_args(&["--sandbox", "podman"]), "hi", &[])
        .await?;
    Ok(())
}

/// SIGTERM during a sandboxed command: hame exits 143 and its container is gone. After a
/// SIGKILL the container is left, and the next hame run removes it (its owner is dead).
#[tokio::test]
async fn no_container_outlives_a_signal_and_orphans_are_reaped() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    use std::time::{Duration, Instant};
    let server = &s.server;
    let state = s.path().join("state").to_string_lossy().into_owned();
    let base = server.base_url();
    for (round, signal) in ["-TERM", "-KILL"].into_iter().enumerate() {
        server.push(exec("s1", "sleep 600"));
        let mut args = vec!["run", "--model", "openai:m"];
        args.extend(docker(&s, &agent, &["--no-memory"]));
        args.push("go");
        let child = super::common::hame(
            &args,
            &[("OPENAI_BASE_URL", &base), ("HAME_STATE_HOME", &state)],
            s.path(),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        // This round's model request arrived (its `sleep` step is taken) and its container runs.
        while server.request_count() < round + 1 || containers_of(&agent).is_empty() {
            assert!(Instant::now() < deadline, "the sandbox never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the command start in the container.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()?;
        assert!(sent.success());
        let status = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
        if signal == "-TERM" {
            assert_eq!(status.status.code(), Some(143));
            assert!(
                containers_of(&agent).is_empty(),
                "SIGTERM: the container is removed"
            );
        } else {
            assert_eq!(
                containers_of(&agent).len(),
                1,
                "SIGKILL leaves the container"
            );
        }
    }
    // The next run (another session: the killed one still holds its session lease)
    // removes the orphan of the killed process.
    server.push(ScriptStep::text("ok"));
    let after = docker(&s, &agent, &["--session", "after", "--no-memory"]);
    s.run_code(0, &after, "x", &[]).await?;
    assert!(containers_of(&agent).is_empty(), "orphan reaped");
    Ok(())
}

/// A sandboxed command past its timeout: the partial output comes back and no process of
/// its tree is left in the container (the next command of the call sees none).
#[tokio::test]
async fn a_command_past_its_timeout_is_killed_with_its_tree() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    s.server.push_all([
        ScriptStep::tool_call(
            "t1",
            "execute",
            json!({"command": "echo started; (sleep 300; echo) & sh -c 'sleep 301' & sleep 302", "timeout_secs": 1}),
        ),
        exec("t2", "ps -o args | grep -c '^sleep 30[012]' || true"),
        ScriptStep::text("done"),
    ]);
    let args = docker(&s, &agent, &["--no-memory"]);
    s.run_code(0, &args, "go", &[]).await?;
    let results = s.results();
    assert!(
        results[0].starts_with("started\n") && results[0].contains("[timed out"),
        "{results:?}"
    );
    assert_eq!(
        last_exec(&s.server),
        "0\n",
        "no process of the tree is left"
    );
    assert!(containers_of(&agent).is_empty());
    Ok(())
}

/// `--isolation agent` from two processes in turn, with `--sandbox-keep`: the first leaves
/// its idle container, the second (another user and session) adopts that very container
/// (same hostname) and sees the first's files; a run without `--sandbox-keep` adopts it too
/// and removes it on exit. With a short TTL a kept container removes itself when no hame
/// process runs any more.
#[tokio::test]
async fn kept_containers_are_adopted_by_the_next_process_and_expire_alone() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    use std::time::{Duration, Instant};
    let server = &s.server;
    let run = |user: &'static str, more: &'static [&'static str]| {
        let s = &s;
        let agent = agent.as_str();
        async move {
            let mut extra = vec!["--user", user, "--isolation", "agent", "--no-memory"];
            extra.extend_from_slice(more);
            s.run_code(0, &docker(s, agent, &extra), "go", &[]).await
        }
    };
    const KEEP: &[&str] = &["--sandbox-keep"];

    server.push_all([
        exec("k1", "echo from-alice > a.txt; hostname"),
        ScriptStep::text("1"),
    ]);
    run("alice", KEEP).await?;
    let host = last_exec(server);
    assert_eq!(containers_of(&agent).len(), 1, "kept after exit");

    server.push_all([exec("k2", "cat a.txt; hostname"), ScriptStep::text("2")]);
    let started = Instant::now();
    run("bob", KEEP).await?;
    let second = started.elapsed();
    assert_eq!(
        last_exec(server),
        format!("from-alice\n{host}"),
        "the same container"
    );

    server.push_all([exec("k3", "cat a.txt; hostname"), ScriptStep::text("3")]);
    run("carol", &[]).await?;
    assert_eq!(last_exec(server), format!("from-alice\n{host}"));
    assert!(
        containers_of(&agent).is_empty(),
        "removed without --sandbox-keep"
    );
    eprintln!("second run with an adopted container: {second:?}");

    // A kept container with a 2 s TTL ends by itself (no hame process is running).
    server.push_all([exec("k4", "cat a.txt"), ScriptStep::text("4")]);
    run("alice", &["--sandbox-keep", "--sandbox-ttl", "2s"]).await?;
    assert_eq!(
        last_exec(server),
        "from-alice\n",
        "restored after the removal"
    );
    assert_eq!(containers_of(&agent).len(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !containers_of(&agent).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the kept container never expired"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("expired alone {:?} after the run", deadline.elapsed());
    Ok(())
}

/// A tool result too large for the context (memory on) is offloaded into the sandbox's
/// `/workspace/large_tool_results/`, where the sandboxed file tools and shell read it back,
/// and it is not written into the host workspace.
#[tokio::test]
async fn offloaded_results_land_in_the_sandbox() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    s.server.push_all([
        exec("o1", "seq 1 20000"),
        exec(
            "o2",
            "ls large_tool_results | wc -l; head -n 2 large_tool_results/*.txt",
        ),
        ScriptStep::text("done"),
    ]);
    s.run_code(0, &docker(&s, &agent, &[]), "go", &[]).await?;
    let preview = s.results().first().cloned().unwrap_or_default();
    assert!(
        preview.contains("/large_tool_results/"),
        "offloaded: {preview}"
    );
    assert_eq!(last_exec(&s.server), "1\n1\n2\n");
    assert!(host_files(&s.ws).is_empty(), "{:?}", host_files(&s.ws));
    Ok(())
}

/// The agent rewrites `tools.json` inside the sandbox (a deny, a stdio MCP server that would
/// run a command on the host): neither takes effect, because `tools.json` is read from the
/// host's copy (ADR 0006); the next call's projection restores the sandbox's copy too.
#[tokio::test]
async fn a_tools_json_written_in_the_sandbox_is_not_obeyed() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    s.write("tools.json", "{\"deny\": [\"list_files\"]}\n")?;
    let marker = s.path().join("escaped");
    let forged = json!({
        "deny": ["read_file"],
        "mcpServers": {"x": {"transport": "stdio", "command": "sh",
                              "args": ["-c", format!("touch {}", marker.display())]}}
    })
    .to_string();
    s.server.push_all([
        exec(
            "t1",
            &format!("printf '%s' '{forged}' > tools.json; echo hi > n.txt"),
        ),
        ScriptStep::tool_call("t2", "read_file", json!({"file_path": "n.txt"})),
        ScriptStep::tool_call("t3", "list_files", json!({})),
        ScriptStep::text("done"),
    ]);
    s.run_code(0, &docker(&s, &agent, &["--no-memory"]), "go", &[])
        .await?;
    let results = s.results();
    assert!(
        results.get(1).is_some_and(|r| r.contains("hi")),
        "read_file is not denied by the forged file: {results:?}"
    );
    assert!(
        results
            .get(2)
            .is_some_and(|r| r.contains("not allowed by tools.json")),
        "the host's deny holds: {results:?}"
    );
    assert!(!marker.exists(), "no host command ran");
    Ok(())
}

/// Bytes of the files under `dir`.
async fn disk_usage(dir: &std::path::Path) -> u64 {
    let Ok(fs) = hame::fs::LocalFs::new(dir) else {
        return 0;
    };
    let files = hame::fs::generic::walk_files(&fs, &hame::fs::FsPath::root()).await;
    files.map_or(0, |f| f.iter().map(|i| i.size).sum())
}

/// Issue #30, item 8, as a user meets it: `hame run`s that each replace an 8 MB file leave
/// the blobs of the last `--sandbox-keep-snapshots` snapshots on the host, not one per
/// call; `hame sandbox gc` finds nothing more to delete.
#[tokio::test]
async fn snapshots_keep_the_last_ones_and_hame_sandbox_gc_sweeps() -> TestResult {
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    const MB8: u64 = 8 << 20;
    let server = &s.server;
    let args = docker(&s, &agent, &["--sandbox-keep-snapshots", "2"]);
    let blobs = s.path().join("state/sandbox-snapshots/blobs");
    for call in 0..4u64 {
        server.push_all([
            exec(
                "c",
                &format!(
                    "head -c {MB8} /dev/urandom > big.bin; echo {call} > n.txt; wc -c < big.bin"
                ),
            ),
            ScriptStep::text("ok"),
        ]);
        s.run_code(0, &args, "go", &[]).await?;
        assert_eq!(last_exec(server), format!("{MB8}\n"));
        let used = disk_usage(&blobs).await;
        let kept = (call + 1).min(2);
        assert!(
            (kept * MB8..kept * MB8 + 4096).contains(&used),
            "after call {call}: {used} bytes of blobs for {kept} kept snapshots"
        );
    }
    let zero = ["--sandbox-keep-snapshots", "0", "--sandbox", "docker"];
    let out = s.run_code(2, &zero, "x", &[]).await?;
    assert!(
        stderr(&out).contains("--sandbox-keep-snapshots 0"),
        "{}",
        stderr(&out)
    );
    let store = s.path().join("state/sandbox-snapshots");
    let out = super::common::output(super::common::hame(
        &[
            "sandbox",
            "gc",
            "--sandbox-snapshots",
            &store.to_string_lossy(),
        ],
        &[],
        s.path(),
    ))
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(
            "3 snapshots read, 4 blobs referenced of 4, 0 deleted (0 bytes), 0 put back"
        ),
        "{}",
        stdout(&out)
    );
    server.push_all([exec("c", "cat n.txt"), ScriptStep::text("ok")]);
    s.run_code(0, &args, "go", &[]).await?;
    assert_eq!(last_exec(server), "3\n");
    Ok(())
}

/// `hame serve --sandbox docker`: an upload through the file routes lands in the caller's
/// sandbox (not on the host), waits for a running turn of the scope instead of writing
/// under its tools, and is in the snapshot a new process starts from.
#[tokio::test]
async fn file_routes_hold_the_sandbox_like_a_turn_and_are_snapshotted() -> TestResult {
    use super::serve::{Serve, client};
    let Some((s, agent)) = docker_scratch().await? else {
        return Ok(());
    };
    let (server, ws) = (&s.server, &s.ws);
    let serve = Serve::start(
        s.path(),
        &server.base_url(),
        &["--agent", &agent, "--sandbox", "docker"],
    )?;
    let r = client()
        .put(serve.at("/v1/sessions/s1/files/inbox/in.txt"))
        .body("uploaded\n")
        .send()
        .await?;
    assert_eq!(r.status(), 201);
    assert!(!ws.join("inbox/in.txt").exists(), "not on the host");

    // A turn whose tool takes 3 s; an upload sent meanwhile waits for it: the tool never
    // sees the file appear under it.
    server.push_all([
        exec(
            "c1",
            "cat inbox/in.txt; sleep 3; cat late.txt 2>/dev/null || echo absent; echo turn > turn.txt",
        ),
        ScriptStep::text("done"),
    ]);
    let turn = tokio::spawn({
        let url = serve.at("/v1/sessions/s1/messages");
        async move {
            client()
                .post(url)
                .json(&json!({"message": "go"}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let started = std::time::Instant::now();
    let r = client()
        .put(serve.at("/v1/sessions/s1/files/late.txt"))
        .body("late\n")
        .send()
        .await?;
    let waited = started.elapsed();
    assert_eq!(r.status(), 201);
    assert_eq!(turn.await??, 200);
    assert_eq!(last_exec(server), "uploaded\nabsent\n");
    eprintln!("the upload waited {waited:?} for the turn");
    let r = client()
        .get(serve.at("/v1/sessions/s1/files/turn.txt"))
        .send()
        .await?;
    assert_eq!(r.text().await?, "turn\n");
    drop(serve);

    // A new process restores the snapshot: both uploads are there.
    server.push_all([
        exec("c2", "cat inbox/in.txt late.txt"),
        ScriptStep::text("ok"),
    ]);
    s.run_code(0, &docker(&s, &agent, &["--session", "s1"]), "again", &[])
        .await?;
    assert_eq!(last_exec(server), "uploaded\nlate\n");
    assert!(
        containers_of(&agent).is_empty(),
        "no container outlives hame"
    );
    Ok(())
}
