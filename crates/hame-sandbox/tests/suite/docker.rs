//! The Docker sandbox against a real engine: conformance, security defaults, timeouts,
//! snapshots across "processes" (new `DockerSandboxes` values) and projection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hame_fs::{ExecRequest, Execute, Filesystem, FsPath, LocalFs};
use hame_sandbox::{Asset, DockerOptions, DockerSandboxes, Sandboxes, ScopeSandbox};
use pretty_assertions::assert_eq;

/// Whether the Docker tests run: loud skip locally, failure in CI.
fn docker_enabled() -> bool {
    hame_test_env::docker("Docker sandbox")
}

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap()
}

async fn sandboxes(snapshots: &std::path::Path, options: DockerOptions) -> DockerSandboxes {
    let store = Arc::new(LocalFs::new(snapshots).unwrap());
    on_store(store, options).await
}

async fn on_store(store: Arc<dyn hame_fs::Filesystem>, options: DockerOptions) -> DockerSandboxes {
    let s = DockerSandboxes::connect(options, store).await.unwrap();
    s.ensure_image().await.unwrap();
    s
}

async fn sh(sb: &dyn ScopeSandbox, command: &str) -> hame_fs::ExecOutput {
    sb.execute(ExecRequest {
        command: command.into(),
        timeout: None,
    })
    .await
    .unwrap()
}

fn key(tag: &str) -> String {
    format!("agents/test/{tag}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_and_security_defaults() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&key("conformance"));
    hame_fs::conformance::run_all(sb.as_ref()).await;

    let out = sh(sb.as_ref(), "id -u; id -g").await;
    assert_eq!(out.output, "1000\n1000\n", "runs as a non-root user");
    let out = sh(sb.as_ref(), "grep CapEff /proc/self/status").await;
    assert!(
        out.output.contains("0000000000000000"),
        "no capabilities: {}",
        out.output
    );
    let out = sh(sb.as_ref(), "grep NoNewPrivs /proc/self/status").await;
    assert!(
        out.output.contains('1'),
        "no-new-privileges: {}",
        out.output
    );
    let out = sh(sb.as_ref(), "touch /bin/x 2>&1; echo $?").await;
    assert!(
        out.output.contains("Read-only"),
        "read-only root: {}",
        out.output
    );
    let out = sh(sb.as_ref(), "touch /tmp/x && echo ok").await;
    assert_eq!(out.output, "ok\n", "/tmp writable");
    let out = sh(sb.as_ref(), "ls /sys/class/net; cat /proc/net/dev | wc -l").await;
    assert_eq!(out.output, "lo\n3\n", "no network but loopback");
    let out = sh(sb.as_ref(), "env | grep -v -e ^HOSTNAME= -e ^SHLVL= | sort").await;
    assert_eq!(
        out.output,
        "HOME=/workspace\nLANG=C.UTF-8\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=/workspace\n",
        "no host environment"
    );
    let out = sh(
        sb.as_ref(),
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
    )
    .await;
    assert_eq!(out.output.trim(), "256", "pids limit");
    let out = sh(
        sb.as_ref(),
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
    )
    .await;
    assert_eq!(out.output.trim(), (2u64 << 30).to_string(), "memory limit");
    let out = sh(sb.as_ref(), "exit 3").await;
    assert_eq!(out.exit_code, Some(3));
    sbs.shutdown().await;
    assert!(sbs.running().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeout_kills_the_whole_tree_and_returns_partial_output() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&key("timeout"));
    let started = Instant::now();
    let out = sb
        .execute(ExecRequest {
            command: "echo before; (sleep 300; echo) & sh -c 'sleep 301' & sleep 302".into(),
            timeout: Some(Duration::from_secs(1)),
        })
        .await
        .unwrap();
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None);
    assert!(out.output.starts_with("before\n"), "{}", out.output);
    assert!(started.elapsed() < Duration::from_secs(5));
    let ps = sh(
        sb.as_ref(),
        "ps -o comm,args | grep -c 'sleep 30[012]' || true",
    )
    .await;
    assert_eq!(ps.output.trim(), "0", "no process of the command is left");
    sbs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_restores_in_a_new_process_and_scopes_stay_apart() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (key("scope-a"), key("scope-b"));
    {
        let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
        let (sa, sb) = (sbs.scope(&a), sbs.scope(&b));
        sa.begin(Vec::new()).await.unwrap();
        sb.begin(Vec::new()).await.unwrap();
        sh(sa.as_ref(), "mkdir -p src && echo alpha > src/a.txt && printf '#!/bin/sh\\necho run\\n' > run.sh && chmod +x run.sh && echo gone > tmp.txt").await;
        sh(sb.as_ref(), "echo beta > b.txt").await;
        let r = sa.end().await.unwrap();
        assert_eq!((r.files, r.uploaded), (3, 3));
        sb.end().await.unwrap();
        // A second call that changes one file and deletes another uploads only the change.
        sa.begin(Vec::new()).await.unwrap();
        sh(sa.as_ref(), "echo alpha2 > src/a.txt; rm tmp.txt").await;
        let r = sa.end().await.unwrap();
        assert_eq!((r.files, r.uploaded, r.removed), (2, 1, 1));
        let ids = sbs.running().await;
        assert_eq!(ids.len(), 2, "one container per scope");
        sbs.shutdown().await;
    }
    // "A new process": a new value, no container left, the state comes from the snapshots.
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sa = sbs.scope(&a);
    let report = sa.begin(Vec::new()).await.unwrap();
    assert!(report.started);
    assert_eq!(report.restored_files, 2);
    let out = sh(sa.as_ref(), "cat src/a.txt; ./run.sh; ls").await;
    assert_eq!(out.output, "alpha2\nrun\nrun.sh\nsrc\n");
    let sb = sbs.scope(&b);
    sb.begin(Vec::new()).await.unwrap();
    assert_eq!(
        sh(sb.as_ref(), "ls").await.output,
        "b.txt\n",
        "scopes never mix"
    );
    // The container of a scope disappears: the next call restores into a new one.
    let id = sbs.running().await;
    assert_eq!(id.len(), 2);
    sa.end().await.unwrap();
    sb.end().await.unwrap();
    sbs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projection_follows_host_edits_and_deletions() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&key("projection"));
    let asset = |path: &str, text: &str| Asset {
        path: p(path),
        bytes: text.as_bytes().to_vec(),
    };
    let r = sb
        .begin(vec![
            asset("AGENTS.md", "v1"),
            asset("skills/a/SKILL.md", "a"),
            asset("skills/b/SKILL.md", "b"),
            asset("notes.md", "not projected"),
        ])
        .await
        .unwrap();
    assert_eq!((r.projected, r.unprojected), (3, 0));
    sb.end().await.unwrap();
    let r = sb
        .begin(vec![
            asset("AGENTS.md", "v2"),
            asset("skills/a/SKILL.md", "a"),
        ])
        .await
        .unwrap();
    assert_eq!(
        (r.projected, r.unprojected),
        (1, 1),
        "only the edit and the deletion"
    );
    let out = sh(
        sb.as_ref(),
        "cat AGENTS.md; echo; find skills -type f; ls notes.md 2>&1 | grep -c 'No such'",
    )
    .await;
    assert_eq!(out.output, "v2\nskills/a/SKILL.md\n1\n");
    // Projected files are the host's: not in the snapshot.
    let r = sb.end().await.unwrap();
    assert_eq!(r.files, 0);
    sbs.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_containers_are_removed_after_the_ttl() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let options = DockerOptions {
        idle_ttl: Duration::from_millis(600),
        ..DockerOptions::default()
    };
    let sbs = sandboxes(dir.path(), options).await;
    let sb = sbs.scope(&key("ttl"));
    sb.begin(Vec::new()).await.unwrap();
    sh(sb.as_ref(), "echo kept > f").await;
    sb.end().await.unwrap();
    assert_eq!(sbs.running().await.len(), 1, "warm after the call");
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(sbs.running().await.is_empty(), "removed after the TTL");
    let r = sb.begin(Vec::new()).await.unwrap();
    assert!(r.started && r.restored_files == 1);
    assert_eq!(sh(sb.as_ref(), "cat f").await.output, "kept\n");
    sb.end().await.unwrap();
    sbs.shutdown().await;
}

/// Snapshots in Redis and in S3 (moto): written by one "process", restored by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_live_in_redis_and_s3_too() {
    if !docker_enabled() {
        return;
    }
    let mut stores: Vec<(&str, Arc<dyn hame_fs::Filesystem>)> = Vec::new();
    let ns = format!("sbx-{}", rand_suffix());
    if let Some(url) = hame_test_env::service("HAME_TEST_REDIS_URL", "Redis snapshot") {
        stores.push(("redis", hame_fs_remote::open(&url, &ns).await.unwrap()));
    }
    if let Some(endpoint) = hame_test_env::service("HAME_TEST_S3_ENDPOINT", "S3 snapshot") {
        let mut o = hame_test_env::moto_s3_settings(&endpoint).into_iter().fold(
            hame_fs_remote::ObjectStoreOptions::default(),
            |o, (k, v)| o.with(k, v),
        );
        o.from_env = false;
        let fs = hame_fs_remote::ObjectStoreFs::open("s3://hame-test/sandbox", &ns, o).unwrap();
        stores.push(("s3", Arc::new(fs)));
    }
    for (name, store) in stores {
        let k = key(name);
        let first = on_store(store.clone(), DockerOptions::default()).await;
        let sb = first.scope(&k);
        sb.begin(Vec::new()).await.unwrap();
        sh(sb.as_ref(), &format!("mkdir -p d && echo in-{name} > d/f")).await;
        sb.end().await.unwrap();
        first.shutdown().await;
        let second = on_store(store, DockerOptions::default()).await;
        let sb = second.scope(&k);
        let r = sb.begin(Vec::new()).await.unwrap();
        assert_eq!((r.started, r.restored_files), (true, 1), "{name}");
        assert_eq!(
            sh(sb.as_ref(), "cat d/f").await.output,
            format!("in-{name}\n")
        );
        second.shutdown().await;
    }
}

/// The command server (one long-lived shell per warm container): concurrent commands of one
/// scope each get their own output, a dropped call kills its command, background jobs do
/// not outlive their command, inputs and outputs past the server's 8 MB go the slow way
/// intact, and hostile command texts are just commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn command_server_concurrency_cancellation_and_large_files() {
    if !docker_enabled() {
        return;
    }
    use hame_fs::WriteOptions;
    let dir = tempfile::tempdir().unwrap();
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&key("server"));
    sb.begin(Vec::new()).await.unwrap();

    // 12 at once: each sees its own output and exit code.
    let runs = (0..12).map(|i| {
        let sb = sb.clone();
        async move {
            let out = sb
                .execute(ExecRequest {
                    command: format!("sleep 0.2; echo out-{i}; echo err-{i} >&2; exit {i}"),
                    timeout: None,
                })
                .await
                .unwrap();
            (i, out)
        }
    });
    for (i, out) in futures::future::join_all(runs).await {
        assert_eq!(out.output, format!("out-{i}\n[stderr] err-{i}\n"));
        assert_eq!(out.exit_code, Some(i));
    }

    // Quotes, newlines, `$(...)` and a leading dash are plain text of the command.
    let out = sh(
        sb.as_ref(),
        "printf '%s|' 'a b' \"it's\" '$(id)' -n; echo\necho line2",
    )
    .await;
    assert_eq!(out.output, "a b|it's|$(id)|-n|\nline2\n");

    // A call dropped mid-command kills it.
    let slow = sb.execute(ExecRequest {
        command: "sleep 311".into(),
        timeout: None,
    });
    let _ = tokio::time::timeout(Duration::from_millis(300), slow).await;
    // Background jobs end with their command.
    sh(sb.as_ref(), "sleep 312 &").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ps = sh(sb.as_ref(), "ps -o args | grep -c '^sleep 31[12]' || true").await;
        if ps.output.trim() == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "left running: {}", ps.output);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server still answers after all that.
    assert_eq!(sh(sb.as_ref(), "echo still").await.output, "still\n");

    // 12 MB with every byte value, written and read back through the file tools.
    let big: Vec<u8> = (0..12 << 20).map(|i: u32| (i % 251) as u8).collect();
    sb.write(&p("big.bin"), big.clone(), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.read_bytes(&p("big.bin")).await.unwrap(), big);
    let small: Vec<u8> = (0..=255u8).chain(b"\n\n".iter().copied()).collect();
    sb.write(&p("small.bin"), small.clone(), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.read_bytes(&p("small.bin")).await.unwrap(), small);
    assert!(sb.exists(&p("small.bin")).await.unwrap());
    // A snapshot holding more than 8 MB of changes, restored in a new "process".
    let report = sb.end().await.unwrap();
    assert_eq!(report.uploaded, 2);
    sbs.shutdown().await;
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(sb.key());
    assert_eq!(sb.begin(Vec::new()).await.unwrap().restored_files, 2);
    assert_eq!(sb.read_bytes(&p("big.bin")).await.unwrap(), big);
    sbs.shutdown().await;
}

/// Two "processes" (two values on one snapshot store) take turns on one scope, each keeping
/// its container warm: before using it, each sees that the other stored a newer snapshot
/// and replaces its stale container, so each sees the other's files; an unchanged store
/// keeps the warm container.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_container_made_stale_by_another_process_is_refreshed() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let k = key("stale");
    let one = sandboxes(dir.path(), DockerOptions::default()).await;
    let two = sandboxes(dir.path(), DockerOptions::default()).await;
    let (a, b) = (one.scope(&k), two.scope(&k));
    let r = a.begin(Vec::new()).await.unwrap();
    assert!(r.started && !r.refreshed);
    sh(a.as_ref(), "echo from-one > one.txt").await;
    a.end().await.unwrap();
    let r = b.begin(Vec::new()).await.unwrap();
    assert_eq!((r.started, r.restored_files), (true, 1));
    assert_eq!(sh(b.as_ref(), "cat one.txt").await.output, "from-one\n");
    sh(b.as_ref(), "echo from-two > two.txt; rm one.txt").await;
    b.end().await.unwrap();
    // One's warm container predates two's snapshot.
    let warm = one.running().await;
    let r = a.begin(Vec::new()).await.unwrap();
    assert!(r.started && r.refreshed, "{r:?}");
    assert_eq!(r.restored_files, 1);
    assert_ne!(
        one.running().await,
        warm,
        "the stale container was replaced"
    );
    assert_eq!(sh(a.as_ref(), "ls").await.output, "two.txt\n");
    sh(a.as_ref(), "echo again > one.txt").await;
    a.end().await.unwrap();
    // Nothing stored in between: the warm container is used as it is.
    let warm = one.running().await;
    let r = a.begin(Vec::new()).await.unwrap();
    assert!(!r.started && !r.refreshed, "{r:?}");
    assert_eq!(one.running().await, warm);
    a.end().await.unwrap();
    let r = b.begin(Vec::new()).await.unwrap();
    assert!(r.refreshed, "{r:?}");
    assert_eq!(
        sh(b.as_ref(), "cat one.txt two.txt").await.output,
        "again\nfrom-two\n"
    );
    b.end().await.unwrap();
    one.shutdown().await;
    two.shutdown().await;
}

/// A file rewritten with the same size in the same second as the last snapshot is not
/// lost (busybox's `find -newer` sees whole seconds only).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_same_second_same_size_rewrite_is_snapshotted() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let k = key("same-second");
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&k);
    for i in 0..5 {
        sb.begin(Vec::new()).await.unwrap();
        sh(sb.as_ref(), &format!("echo {i} > f.txt")).await;
        sb.end().await.unwrap();
    }
    sbs.shutdown().await;
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&k);
    sb.begin(Vec::new()).await.unwrap();
    assert_eq!(sh(sb.as_ref(), "cat f.txt").await.output, "4\n");
    sbs.shutdown().await;
}

/// A fork bomb cannot take the command server down (issue #30, item 10): whether the bomb's
/// main process returns at once (`:(){ :|:& };:`) or stays (a bomb, then `sleep`, killed
/// at its timeout), its whole process group is killed, and the next command of the same
/// call, through the same warm container, works — every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_bomb_leaves_the_command_server_working() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&key("fork-bomb"));
    sb.begin(Vec::new()).await.unwrap();
    let container = sbs.running().await;
    let bombs = [
        "f(){ f|f& }; f",
        "b(){ b|b& }; b; sleep 100",
        "while :; do sh -c 'sleep 100' & done",
    ];
    let mut exhausted = 0;
    for i in 0..10 {
        let bomb = bombs[i % bombs.len()];
        let started = Instant::now();
        let out = sb
            .execute(ExecRequest {
                command: bomb.into(),
                timeout: Some(Duration::from_secs(2)),
            })
            .await;
        let took = started.elapsed();
        let out = out.unwrap_or_else(|e| panic!("run {i} ({bomb:?}): {e}"));
        eprintln!(
            "run {i}: {bomb:?} -> exit {:?}, timed out {}, in {took:?}",
            out.exit_code, out.timed_out
        );
        if out.output.contains("can't fork") {
            exhausted += 1;
        }
        assert!(took < Duration::from_secs(10), "run {i}: {took:?}");
        let next = sb
            .execute(ExecRequest {
                command: "echo alive; ps -o pid= | wc -l".into(),
                timeout: Some(Duration::from_secs(10)),
            })
            .await
            .unwrap_or_else(|e| panic!("run {i} ({bomb:?}): the next command failed: {e}"));
        let mut lines = next.output.lines();
        assert_eq!(
            lines.next(),
            Some("alive"),
            "run {i} ({bomb:?}): {}",
            next.output
        );
        let procs: usize = lines
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(999);
        assert!(
            procs < 40,
            "run {i} ({bomb:?}): {procs} processes left: {}",
            next.output
        );
    }
    assert!(
        exhausted >= 3,
        "the bombs reached the pids limit in {exhausted} runs of 10"
    );
    assert_eq!(
        sbs.running().await,
        container,
        "the same container all along"
    );
    sb.end().await.unwrap();
    sbs.shutdown().await;
}

/// Bytes of the files under `dir`.
async fn disk_usage(dir: &std::path::Path) -> u64 {
    let Ok(fs) = hame_fs::LocalFs::new(dir) else {
        return 0;
    };
    let files = hame_fs::generic::walk_files(&fs, &hame_fs::FsPath::root()).await;
    files.map_or(0, |f| f.iter().map(|i| i.size).sum())
}

/// Snapshots do not grow without bound (issue #30, item 8): calls of one scope in
/// successive processes, each replacing an 8 MB file, leave the blobs of the last 3
/// snapshots (the default) on the store, not one blob per call; the newest still restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_blobs_are_collected_keeping_the_last_snapshots() {
    if !docker_enabled() {
        return;
    }
    const MB8: u64 = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let k = key("gc");
    for call in 0..5u64 {
        let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
        let sb = sbs.scope(&k);
        sb.begin(Vec::new()).await.unwrap();
        let out = sh(
            sb.as_ref(),
            &format!("head -c {MB8} /dev/urandom > big.bin && echo {call} > n.txt && echo ok"),
        )
        .await;
        assert_eq!(out.output, "ok\n");
        sb.end().await.unwrap();
        sbs.shutdown().await;
        let used = disk_usage(&dir.path().join("blobs")).await;
        let kept = (call + 1).min(3);
        eprintln!("after call {call}: {used} bytes of blobs");
        assert!(
            used >= kept * MB8 && used <= kept * MB8 + (1 << 20),
            "after call {call}: {used} bytes of blobs, expected the {kept} last snapshots' {} bytes",
            kept * MB8
        );
    }
    let sbs = sandboxes(dir.path(), DockerOptions::default()).await;
    let sb = sbs.scope(&k);
    let r = sb.begin(Vec::new()).await.unwrap();
    assert_eq!(r.restored_files, 2);
    assert_eq!(
        sh(sb.as_ref(), "cat n.txt; wc -c < big.bin").await.output,
        format!("4\n{MB8}\n")
    );
    sbs.shutdown().await;
}

/// A snapshot store whose listings of blobs and moves take 20 ms each (a slow object
/// store): a sweep then spends a while between its first mark and its moves, the window
/// another process's snapshot can fall into.
#[derive(Debug)]
struct SlowSweeps(LocalFs);

hame_fs::forward_filesystem! {
    impl Filesystem for SlowSweeps {
        inner = |s| &s.0;
        forward = [
            stat, read_bytes, write, delete, exists, read_range, append, edit, grep, glob,
            list_many,
        ];
        async fn list(&self, path: &FsPath) -> hame_fs::Result<Vec<hame_fs::FileInfo>> {
            if path.as_str().starts_with("blobs") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.0.list(path).await
        }
        async fn rename(
            &self,
            from: &FsPath,
            to: &FsPath,
            options: hame_fs::RenameOptions,
        ) -> hame_fs::Result<()> {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.0.rename(from, to, options).await
        }
    }
}

/// Sweeps of the snapshot store are safe against other processes (issue #30, item 8): one
/// "process" snapshots scope A over and over (keeping 1 snapshot), a second one restores scope B into a new container each time and snapshots it
/// with contents A keeps dropping (so B reuses blobs that are garbage for A), and a third
/// sweeps the store in a loop, slowly (its listings of blobs and its moves take 20 ms). Every restore of B finds
/// every blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweeps_never_take_a_blob_from_a_concurrent_restore() {
    if !docker_enabled() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Only the third process sweeps (slowly), so garbage waits for it.
    let options = DockerOptions {
        keep_snapshots: 1,
        gc_interval: None,
        ..DockerOptions::default()
    };
    let (one, two, three) = (
        sandboxes(dir.path(), options.clone()).await,
        sandboxes(dir.path(), options).await,
        on_store(
            Arc::new(SlowSweeps(LocalFs::new(dir.path()).unwrap())),
            DockerOptions::default(),
        )
        .await,
    );
    let (a, b) = (one.scope(&key("gc-a")), two.scope(&key("gc-b")));
    let payload = |n: usize| format!("yes {} | head -c 1048576 > f && echo ok", n % 3);
    let done = std::sync::atomic::AtomicBool::new(false);
    let writer = async {
        for i in 0..14 {
            a.begin(Vec::new()).await.unwrap();
            assert_eq!(sh(a.as_ref(), &payload(i)).await.output, "ok\n");
            a.end().await.unwrap();
        }
    };
    let restorer = async {
        b.begin(Vec::new()).await.unwrap();
        assert_eq!(sh(b.as_ref(), &payload(0)).await.output, "ok\n");
        b.end().await.unwrap();
        b.discard().await;
        for j in 0..12 {
            let r = b
                .begin(Vec::new())
                .await
                .unwrap_or_else(|e| panic!("restore {j}: {e}"));
            assert_eq!((r.started, r.restored_files), (true, 1), "restore {j}");
            assert_eq!(
                sh(b.as_ref(), "head -c 1 f; wc -c < f").await.output,
                format!("{}1048576\n", j % 3),
                "restore {j}"
            );
            assert_eq!(sh(b.as_ref(), &payload(j + 1)).await.output, "ok\n");
            b.end().await.unwrap();
            b.discard().await;
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let sweeper = async {
        let mut sweeps = 0;
        let mut restored = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let r = three.collect_garbage().await.unwrap();
            sweeps += 1;
            restored += r.restored;
        }
        (sweeps, restored)
    };
    let ((), (), (sweeps, restored)) = tokio::join!(writer, restorer, sweeper);
    eprintln!("{sweeps} sweeps of the third process alongside; {restored} blobs put back");
    assert!(sweeps > 5, "{sweeps}");
    for s in [&one, &two, &three] {
        s.shutdown().await;
    }
    // A last sweep leaves only what the kept snapshots reference: A's last and B's last.
    three.collect_garbage().await.unwrap();
    let report = three.collect_garbage().await.unwrap();
    assert!(
        report.blobs <= 2 && report.deleted == 0 && report.referenced == report.blobs,
        "{report:?}"
    );
    assert!(disk_usage(&dir.path().join("blobs")).await <= 2 << 20);
    assert!(disk_usage(&dir.path().join("trash")).await == 0);
}
