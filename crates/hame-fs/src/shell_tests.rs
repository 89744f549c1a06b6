#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The process model of [`LocalShell`], checked over `/proc`: which processes of a
//! command's group are still alive after a timeout, a dropped future, and hame's death.

use std::path::Path;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;

use super::*;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Writes the command's process group id to `pgid` in the root (`cut` runs in the group).
const RECORD_PGID: &str = "cut -d' ' -f5 /proc/self/stat > pgid";

/// The live (not zombie) processes whose process group is `pgid`, as `(pid, name)`.
fn live_members(pgid: i32) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let (Some(state), Some(pgrp)) = (fields.first(), fields.get(2)) else {
            continue;
        };
        if *state != "Z" && pgrp.parse() == Ok(pgid) {
            out.push((pid, stat[open + 1..close].to_owned()));
        }
    }
    out.sort();
    out
}

/// Polls until no live process of `pgid` is left or `within` has passed; what is left.
async fn left_after(pgid: i32, within: Duration) -> Vec<(i32, String)> {
    let deadline = Instant::now() + within;
    loop {
        let left = live_members(pgid);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The process group the command recorded in `dir/pgid`, once it is there.
async fn recorded_pgid(dir: &Path, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(s) = std::fs::read_to_string(dir.join("pgid"))
            && let Ok(pgid) = s.trim().parse()
        {
            return pgid;
        }
        assert!(
            Instant::now() < deadline,
            "the command never recorded its group"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts the group is really running (so "nothing left" later is not vacuous): the
/// leader, the watchdog and `sleep` are alive.
fn assert_running(pgid: i32) {
    let members = live_members(pgid);
    assert!(
        members.iter().any(|(_, name)| name == "sleep") && members.len() >= 3,
        "group {pgid} should be running: {members:?}"
    );
    assert_ne!(
        pgid,
        rustix::process::getpgrp().as_raw_nonzero().get(),
        "the command must not share the test's process group"
    );
}

fn shell(dir: &Path) -> LocalShell {
    LocalShell::new(dir, ShellOptions::default())
}

fn request(command: &str, timeout: Duration) -> ExecRequest {
    ExecRequest {
        command: command.to_owned(),
        timeout: Some(timeout),
    }
}

#[tokio::test]
async fn a_finished_command_reports_its_output_and_exit_code() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = shell(dir.path())
        .execute(request(
            "echo out; echo err >&2; exit 7",
            Duration::from_secs(10),
        ))
        .await?;
    assert_eq!(
        out,
        ExecOutput {
            output: "out\n[stderr] err\n".into(),
            exit_code: Some(7),
            truncated: false,
            timed_out: false,
            signal: None,
            stdout_bytes: 4,
            stderr_bytes: 4,
            stdout_truncated: false,
            stderr_truncated: false,
        }
    );
    Ok(())
}

#[tokio::test]
async fn a_timeout_kills_the_whole_group_and_returns_the_output_so_far() -> TestResult {
    let dir = tempfile::tempdir()?;
    let sh = shell(dir.path());
    // A background sleep and a foreground sleep, both in the group.
    let command = format!("sleep 30 & {RECORD_PGID}; echo started; echo working >&2; sleep 30");
    let started = Instant::now();
    let run =
        tokio::spawn(async move { sh.execute(request(&command, Duration::from_secs(1))).await });
    let pgid = recorded_pgid(dir.path(), Duration::from_secs(5)).await;
    assert_running(pgid);
    let out = run.await??;
    let took = started.elapsed();
    assert_eq!(
        out,
        ExecOutput {
            output: "started\n[stderr] working\n".into(),
            exit_code: None,
            truncated: false,
            timed_out: true,
            signal: out.signal,
            stdout_bytes: 8,
            stderr_bytes: 8,
            stdout_truncated: false,
            stderr_truncated: false,
        }
    );
    // Timeout (1 s), then at most the grace (0.5 s) and the drain (0.25 s).
    assert!(took < Duration::from_secs(3), "took {took:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(live_members(pgid), vec![], "1 s after the timeout");
    Ok(())
}

#[tokio::test]
async fn dropping_the_future_kills_the_whole_group() -> TestResult {
    let dir = tempfile::tempdir()?;
    let sh = shell(dir.path());
    let command = format!("sleep 30 & {RECORD_PGID}; sleep 30");
    let run =
        tokio::spawn(async move { sh.execute(request(&command, Duration::from_secs(60))).await });
    let pgid = recorded_pgid(dir.path(), Duration::from_secs(5)).await;
    assert_running(pgid);
    run.abort();
    assert!(run.await.is_err_and(|e| e.is_cancelled()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(live_members(pgid), vec![], "1 s after the drop");
    Ok(())
}

#[tokio::test]
async fn a_command_that_signals_its_own_group_does_not_hang() -> TestResult {
    // `kill 0` sends SIGTERM to the whole group: the command and the leader die, the
    // watchdog (which ignores SIGTERM) must neither hold the output open nor survive.
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let out = shell(dir.path())
        .execute(request(
            &format!("{RECORD_PGID}; echo before; kill 0; sleep 30"),
            Duration::from_secs(20),
        ))
        .await?;
    assert!(started.elapsed() < Duration::from_secs(5), "{out:?}");
    assert_eq!((out.output.as_str(), out.exit_code), ("before\n", None));
    let pgid = recorded_pgid(dir.path(), Duration::from_secs(1)).await;
    assert_eq!(left_after(pgid, Duration::from_secs(1)).await, vec![]);
    Ok(())
}

/// Set in the environment of the helper process of the SIGKILL test: its root directory.
const HELPER_ENV: &str = "HAME_FS_TEST_SHELL_HELPER_ROOT";

/// Not a test on its own: the body of the helper process that
/// [`sigkill_of_hame_kills_the_group`] starts (this test binary again, with
/// [`HELPER_ENV`] set). It runs `sleep 300` through a `LocalShell` and is killed.
#[tokio::test]
async fn sigkill_helper() -> TestResult {
    let Some(root) = std::env::var_os(HELPER_ENV) else {
        return Ok(());
    };
    let command = format!("{RECORD_PGID}; sleep 300");
    let out = shell(Path::new(&root))
        .execute(request(&command, Duration::from_secs(600)))
        .await?;
    Err(format!("the helper should have been killed, but the command ended: {out:?}").into())
}

#[tokio::test]
async fn sigkill_of_hame_kills_the_group() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut helper = std::process::Command::new(std::env::current_exe()?)
        .args(["shell::tests::sigkill_helper", "--exact", "--nocapture"])
        .env(HELPER_ENV, dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let pgid = recorded_pgid(dir.path(), Duration::from_secs(20)).await;
    assert_running(pgid);
    // SIGKILL: hame runs no code at all on the way out.
    helper.kill()?;
    let status = helper.wait()?;
    assert_eq!(status.code(), None, "the helper was killed by a signal");
    let left = left_after(pgid, Duration::from_secs(2)).await;
    assert_eq!(left, vec![], "the group outlived hame by 2 s");
    Ok(())
}
