#![allow(clippy::unwrap_used)]

use hame_core::RuntimeContext;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;
use hame_fs::{InMemoryFs, Scope};

fn ctx(user: &str, session: &str) -> ToolContext {
    ToolContext::new(RuntimeContext::new(session).with_user(user), "c1")
}

fn tool<'a>(tools: &'a [Arc<dyn Tool>], name: &str) -> &'a Arc<dyn Tool> {
    tools.iter().find(|t| t.spec().name == name).unwrap()
}

async fn call(
    tools: &[Arc<dyn Tool>],
    name: &str,
    args: serde_json::Value,
    c: &ToolContext,
) -> ToolOutput {
    tool(tools, name).call(args, c).await
}

/// `write_file` that must succeed.
async fn write(tools: &[Arc<dyn Tool>], file_path: &str, content: &str, c: &ToolContext) {
    run(
        tools,
        "write_file",
        json!({"file_path": file_path, "content": content}),
        c,
    )
    .await;
}

/// `edit_file` of `old` to `new`.
async fn edit(
    tools: &[Arc<dyn Tool>],
    file_path: &str,
    (old, new): (&str, &str),
    c: &ToolContext,
) -> ToolOutput {
    let args = json!({"file_path": file_path, "old_string": old, "new_string": new});
    call(tools, "edit_file", args, c).await
}

/// `call` that must succeed.
async fn run(
    tools: &[Arc<dyn Tool>],
    name: &str,
    args: serde_json::Value,
    c: &ToolContext,
) -> String {
    call(tools, name, args, c).await.unwrap()
}

/// `call` that must fail; its error code.
async fn fails(
    tools: &[Arc<dyn Tool>],
    name: &str,
    args: serde_json::Value,
    c: &ToolContext,
) -> String {
    code(call(tools, name, args, c).await)
}

/// What `fs` holds at `path`.
async fn stored(fs: &Arc<dyn Filesystem>, path: &str) -> Vec<u8> {
    fs.read_bytes(&FsPath::parse(path).unwrap()).await.unwrap()
}

fn code(r: ToolOutput) -> String {
    r.unwrap_err().code
}

#[tokio::test]
async fn two_tenants_never_see_each_other() {
    let store: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
    let template: Arc<dyn Filesystem> =
        Arc::new(InMemoryFs::with_files([("AGENTS.md", b"shared rules\n".as_slice())]).unwrap());
    // Each call carries its tenant's handle, as the harness makes it: its namespace in the
    // store over the read-only template.
    let tools = crate::workspace_tools(FsToolOptions::default(), false);
    let iso = hame_fs::Isolation {
        agent_id: "coder".into(),
        scope: Scope::User,
        template: Some(template),
    };
    let tenant = |user: &str| -> hame_core::ToolContext {
        let files = iso.fs_for(&store, Some(user), "s1").unwrap();
        let mut ext = hame_core::Extensions::new();
        ext.insert(crate::Workspace::new(
            crate::Identity::new("coder", Some(user), "s1"),
            crate::WorkspaceMode::SharedStore,
            files.clone(),
            files,
        ));
        ctx(user, "s1").with_extensions(ext)
    };
    let (alice, bob) = (tenant("alice"), tenant("bob"));
    write(&tools, "/notes.md", "alice secret", &alice).await;
    // Bob sees the shared template but none of Alice's files, by any path.
    assert!(
        run(&tools, "read_file", json!({"file_path": "AGENTS.md"}), &bob)
            .await
            .contains("shared rules")
    );
    for p in [
        "/notes.md",
        "notes.md",
        "../alice/home/notes.md",
        "/agents/coder/users/alice/home/notes.md",
        "%2e%2e/alice/home/notes.md",
    ] {
        let r = call(&tools, "read_file", json!({"file_path": p}), &bob).await;
        assert!(r.is_err(), "{p}: {r:?}");
    }
    let grep = run(&tools, "grep_files", json!({"pattern": "secret"}), &bob).await;
    assert_eq!(grep, "No matches.");
    let glob = run(&tools, "glob_files", json!({"pattern": "**"}), &bob).await;
    assert_eq!(glob, "/AGENTS.md\n");
    let list = run(&tools, "list_files", json!({}), &bob).await;
    assert_eq!(list, "/AGENTS.md (13 bytes)\n");
    let e = edit(&tools, "/notes.md", ("alice", "bob"), &bob).await;
    assert_eq!(code(e), "file_not_found");
    // Bob's own file with the same name is a different file.
    write(&tools, "/notes.md", "bob", &bob).await;
    assert_eq!(
        stored(&store, "agents/coder/users/alice/home/notes.md").await,
        b"alice secret"
    );
    assert_eq!(
        stored(&store, "agents/coder/users/bob/home/notes.md").await,
        b"bob"
    );
    // An id that tries to climb gets no handle at all, and a call without a handle reaches
    // no tenant's files.
    let evil = iso
        .fs_for(&store, Some("../alice"), "s1")
        .map(|_| ())
        .map_err(|e| e.code());
    assert_eq!(evil, Err("invalid_path"));
    assert_eq!(
        fails(
            &tools,
            "read_file",
            json!({"file_path": "/notes.md"}),
            &ctx("../alice", "s1")
        )
        .await,
        "tool_failed"
    );
}

#[tokio::test]
async fn write_requires_a_fresh_read_and_edit_keeps_crlf() {
    let fs: Arc<dyn Filesystem> =
        Arc::new(InMemoryFs::with_files([("a.txt", b"one\r\ntwo\r\n".as_slice())]).unwrap());
    let tools = fs_tools(fs.clone(), FsToolOptions::default());
    let c = ctx("u", "s");
    let w = json!({"file_path": "a.txt", "content": "new"});
    assert_eq!(fails(&tools, "write_file", w.clone(), &c).await, "conflict");
    let read = run(&tools, "read_file", json!({"file_path": "a.txt"}), &c).await;
    assert_eq!(read, "     1\tone\n     2\ttwo\n");
    // Someone else changes it after our read: the write is refused.
    fs.write(
        &FsPath::parse("a.txt").unwrap(),
        b"one\r\ntwo\r\nthree\r\n".to_vec(),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(fails(&tools, "write_file", w.clone(), &c).await, "conflict");
    run(&tools, "read_file", json!({"file_path": "a.txt"}), &c).await;
    let out = edit(&tools, "a.txt", ("two\nthree", "2\n3"), &c)
        .await
        .unwrap();
    assert_eq!(out, "Edited /a.txt: 1 replacement.");
    assert_eq!(stored(&fs, "a.txt").await, b"one\r\n2\r\n3\r\n");
    run(&tools, "write_file", w, &c).await;
    let e = edit(&tools, "a.txt", ("", "x"), &c).await;
    assert_eq!(code(e), "invalid_arguments");
    // Another session has not read it.
    let other = ctx("u", "s2");
    assert_eq!(
        fails(
            &tools,
            "write_file",
            json!({"file_path": "a.txt", "content": "x"}),
            &other
        )
        .await,
        "conflict"
    );
}

#[tokio::test]
async fn read_pages_and_caps_lines() {
    let body: String =
        (1..=30).map(|i| format!("line {i}\n")).collect::<String>() + &"x".repeat(50);
    let fs: Arc<dyn Filesystem> =
        Arc::new(InMemoryFs::with_files([("f", body.as_bytes())]).unwrap());
    let tools = fs_tools(
        fs,
        FsToolOptions {
            read_default_lines: 10,
            max_line_chars: 20,
            ..FsToolOptions::default()
        },
    );
    let c = ctx("u", "s");
    let first = run(&tools, "read_file", json!({"file_path": "f"}), &c).await;
    assert!(
        first.ends_with("[showing lines 1-10 of 31; call read_file with offset=11 to continue]"),
        "{first}"
    );
    let last = run(
        &tools,
        "read_file",
        json!({"file_path": "f", "offset": 31}),
        &c,
    )
    .await;
    assert_eq!(
        last,
        format!("    31\t{}… [line truncated]\n", "x".repeat(20))
    );
    let bin: Arc<dyn Filesystem> =
        Arc::new(InMemoryFs::with_files([("b", b"\x00\x01".as_slice())]).unwrap());
    let e = call(
        &fs_tools(bin, FsToolOptions::default()),
        "read_file",
        json!({"file_path": "b"}),
        &c,
    )
    .await;
    assert_eq!(code(e), "binary_file");
}

#[tokio::test]
async fn grep_and_glob_cap_their_output() {
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| (format!("d/f{i:02}.txt"), b"hit\n".to_vec()))
        .collect();
    let fs = InMemoryFs::new();
    for (p, d) in &files {
        fs.write(
            &FsPath::parse(p).unwrap(),
            d.clone(),
            WriteOptions::default(),
        )
        .await
        .unwrap();
    }
    let tools = fs_tools(
        Arc::new(fs),
        FsToolOptions {
            grep_max_results: 3,
            glob_max_results: 2,
            ..FsToolOptions::default()
        },
    );
    let c = ctx("u", "s");
    let g = run(
        &tools,
        "grep_files",
        json!({"pattern": "hit", "literal": true}),
        &c,
    )
    .await;
    assert_eq!(
        g,
        "/d/f00.txt:1:hit\n/d/f01.txt:1:hit\n/d/f02.txt:1:hit\n[more results not shown (limit 3); narrow the search with path or glob]"
    );
    let gl = run(&tools, "glob_files", json!({"pattern": "**/*.txt"}), &c).await;
    assert_eq!(
        gl,
        "/d/f00.txt\n/d/f01.txt\n[more files not shown (limit 2); use a narrower pattern or path]"
    );
    let names: Vec<String> = tools.iter().map(|t| t.spec().name).collect();
    assert_eq!(
        names,
        vec![
            "read_file",
            "write_file",
            "edit_file",
            "grep_files",
            "glob_files",
            "list_files"
        ],
        "no execute without an executor"
    );
}

mod shell {
    use super::*;
    use hame_fs::{LocalShell, ShellOptions};
    use pretty_assertions::assert_eq;

    /// The tools with a local shell rooted in a fresh directory.
    fn shell_tools(opts: ShellOptions) -> (tempfile::TempDir, Vec<Arc<dyn Tool>>) {
        let dir = tempfile::tempdir().unwrap();
        let tools = fs_tools(
            Arc::new(InMemoryFs::new()),
            FsToolOptions {
                executor: Some(Arc::new(LocalShell::new(dir.path(), opts))),
                ..FsToolOptions::default()
            },
        );
        (dir, tools)
    }

    /// `execute` with these arguments, which must succeed.
    async fn execute(tools: &[Arc<dyn Tool>], args: serde_json::Value) -> String {
        run(tools, "execute", args, &ctx("u", "s")).await
    }

    #[tokio::test]
    async fn execute_reports_exit_code_and_clears_env() {
        let (dir, tools) = shell_tools(ShellOptions {
            env: vec![("EXTRA".into(), "1".into())],
            ..ShellOptions::default()
        });
        let command = "pwd; env | sort | cut -d= -f1; echo oops >&2; exit 3";
        let out = execute(&tools, json!({ "command": command })).await;
        let root = dir.path().canonicalize().unwrap();
        assert_eq!(
            out,
            format!(
                "{}\nEXTRA\nHOME\nLANG\nPATH\nPWD\n[stderr] oops\n\n[exit code 3]",
                root.display()
            )
        );
    }

    #[tokio::test]
    async fn execute_kills_the_process_group_on_timeout() {
        let (dir, tools) = shell_tools(ShellOptions {
            max_timeout: std::time::Duration::from_secs(1),
            ..ShellOptions::default()
        });
        // The background grandchild would create the marker after 2 s if it survived.
        let command = "(sleep 2; touch marker) & sleep 30";
        let out = execute(&tools, json!({"command": command, "timeout_secs": 100})).await;
        assert!(out.contains("[timed out"), "{out}");
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        assert!(
            !dir.path().join("marker").exists(),
            "a process of the group survived"
        );
    }

    #[tokio::test]
    async fn execute_returns_the_output_so_far_on_timeout() {
        let (_dir, tools) = shell_tools(ShellOptions::default());
        let command = "echo first; sleep 30";
        let out = execute(&tools, json!({"command": command, "timeout_secs": 1})).await;
        assert_eq!(
            out,
            "first\n\n[timed out: the command and its process group were killed; the output above is what it printed until then; raise timeout_secs if it needs longer]"
        );
    }

    #[tokio::test]
    async fn cancelling_the_call_kills_the_process_group() {
        let (dir, tools) = shell_tools(ShellOptions::default());
        let c = ctx("u", "s");
        let cancel = c.cancel.clone();
        // The background grandchild would create the marker after 2 s if it survived.
        let command = "(sleep 2; touch marker) & touch started; sleep 30";
        let call = call(&tools, "execute", json!({ "command": command }), &c);
        let stop = async {
            while !dir.path().join("started").exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            cancel.cancel();
        };
        let (out, ()) = tokio::join!(call, stop);
        assert_eq!(code(out), "cancelled");
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        assert!(
            !dir.path().join("marker").exists(),
            "a process of the group survived the cancellation"
        );
    }

    #[tokio::test]
    async fn execute_truncates_output() {
        let (_dir, tools) = shell_tools(ShellOptions {
            max_output_bytes: 10,
            ..ShellOptions::default()
        });
        let out = execute(&tools, json!({"command": "yes | head -c 100000"})).await;
        assert_eq!(
            out,
            "y\ny\ny\ny\ny\n\n[output truncated at 10 bytes]\n[exit code 0]"
        );
    }
}

/// Issue #34: `read_file` of a large file reads only up to the window it returns (in
/// ranges), says how big the file is instead of counting its lines, and a later
/// `write_file` still refuses a file that changed since.
#[tokio::test]
async fn read_of_a_large_file_reads_only_its_window() {
    // 4 MiB of numbered lines.
    let body: String = (1..=200_000).map(|i| format!("line {i:014}\n")).collect();
    let size = body.len();
    let mem: Arc<dyn Filesystem> =
        Arc::new(InMemoryFs::with_files([("big.log", body.as_bytes())]).unwrap());
    let counting = hame_fs::CountingFs::new(mem);
    let fs: Arc<dyn Filesystem> = Arc::new(counting.clone());
    let tools = fs_tools(fs.clone(), FsToolOptions::default());
    let c = ctx("u", "s");
    let first = run(&tools, "read_file", json!({"file_path": "big.log"}), &c).await;
    assert!(
        first.starts_with("     1\tline 00000000000001\n"),
        "{first}"
    );
    assert!(
        first.ends_with(&format!(
            "[showing lines 1-2000 of a {size} byte file; call read_file with offset=2001 to continue]"
        )),
        "{}",
        &first[first.len() - 200..]
    );
    let counts = counting.counts();
    assert_eq!(counts.of("read_bytes"), 0);
    assert!(counts.bytes_read <= 2 * READ_WHOLE_MAX_BYTES, "{counts:?}");
    // A window further in: read up to it, not past it.
    counting.reset();
    let mid = run(
        &tools,
        "read_file",
        json!({"file_path": "big.log", "offset": 50_000, "limit": 3}),
        &c,
    )
    .await;
    assert_eq!(
        mid.lines().take(3).collect::<Vec<_>>(),
        [
            " 50000\tline 00000000050000",
            " 50001\tline 00000000050001",
            " 50002\tline 00000000050002"
        ]
    );
    assert!(counting.counts().bytes_read < (size / 2) as u64);
    // The end: the count is known there.
    let end = run(
        &tools,
        "read_file",
        json!({"file_path": "big.log", "offset": 199_999}),
        &c,
    )
    .await;
    assert_eq!(
        end,
        "199999\tline 00000000199999\n200000\tline 00000000200000\n"
    );
    // Read in a window, then overwritten: allowed while unchanged...
    write(&tools, "big.log", "short", &c).await;
    assert_eq!(stored(&fs, "big.log").await, b"short");
    // ...refused once another writer changed it after the read.
    let big2: String = "y\n".repeat(300_000);
    fs.write(
        &FsPath::parse("big2.log").unwrap(),
        big2.clone().into_bytes(),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    run(&tools, "read_file", json!({"file_path": "big2.log"}), &c).await;
    fs.write(
        &FsPath::parse("big2.log").unwrap(),
        (big2 + "z").into_bytes(),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    let e = fails(
        &tools,
        "write_file",
        json!({"file_path": "big2.log", "content": "x"}),
        &c,
    )
    .await;
    assert_eq!(e, "conflict");
}
