//! [`LocalShell`]: the [`Execute`] capability on the local machine (`sh -c` in the root),
//! with every command's processes tied to hame's lifetime.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

use crate::error::{Error, Result};
use crate::fs::{ExecOutput, ExecRequest, Execute};
use crate::output::{CappedOutput, render_output};

/// Options of [`LocalShell`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellOptions {
    /// Timeout when the request gives none. Default 120 s.
    pub default_timeout: Duration,
    /// Longest timeout a request may ask for. Default 600 s.
    pub max_timeout: Duration,
    /// Output kept (stdout + stderr), in bytes. Default 100,000.
    pub max_output_bytes: usize,
    /// Pass the whole parent environment. Default `false`: the child gets only `PATH` (the
    /// parent's, or `/usr/local/bin:/usr/bin:/bin`), `HOME` (the root), `LANG=C.UTF-8`, plus
    /// [`ShellOptions::env`].
    pub inherit_env: bool,
    /// Extra variables (override the minimal set).
    pub env: Vec<(String, String)>,
    /// How long a command's process group has between `SIGTERM` and `SIGKILL` when it is
    /// stopped (timeout, cancellation, a dropped future). Default 500 ms.
    pub kill_grace: Duration,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output_bytes: 100_000,
            inherit_env: false,
            env: Vec::new(),
            kill_grace: Duration::from_millis(500),
        }
    }
}

/// How long the output of a killed group is still collected after `SIGKILL` (only a process
/// that left the group can hold the pipes open that long).
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(250);

/// The process that runs each command, as the leader of the command's own process group.
///
/// `$1` is the command. It runs as `sh -c "$1"` in the background of the leader, with
/// stdin from `/dev/null`. Beside it a watchdog (ignoring `SIGTERM`, so it outlives a
/// group `SIGTERM` until the `SIGKILL`) reads the leader's stdin, the *lifeline*: a pipe
/// whose only writer is hame. The read returns when hame closes it, which the kernel does
/// when hame dies however it dies (`SIGKILL` included); the watchdog then `SIGKILL`s the
/// whole group. When the command ends, the leader kills the watchdog and exits with the
/// command's status. The watchdog's output goes to `/dev/null`, so it never holds the
/// command's pipes open.
const LEADER: &str = r#"exec 3<&0
sh -c "$1" </dev/null 3<&- &
c=$!
(trap '' TERM; read -r _ <&3; kill -s KILL 0) </dev/null >/dev/null 2>&1 &
w=$!
exec 3<&-
wait "$c"
s=$?
kill -s KILL "$w" 2>/dev/null
exit "$s""#;

/// Runs commands with `sh -c` in a local directory, each in its own process group, and
/// makes sure no process of that group outlives the command's future or hame itself:
///
/// * on timeout, cancellation or when the `execute` future is dropped, the whole group gets
///   `SIGTERM`, then `SIGKILL` after [`ShellOptions::kill_grace`];
/// * when hame dies (even by `SIGKILL`), a watchdog in the group sees the lifeline pipe
///   close and `SIGKILL`s the group (see the process model in `docs/filesystem.md`);
/// * on timeout, the output printed until then is returned (`timed_out: true`).
///
/// Not covered: processes that leave the group (`setsid`, `setpgid`, daemons that
/// double-fork into a new session), and background processes a command leaves running
/// after it returns normally with their output redirected away (they are not killed when
/// the command returns, nor when hame dies later).
///
/// This is **not** an isolation boundary: the command runs with the host user's rights and
/// can read anything that user can. Use a sandbox (container) backend for untrusted tenants.
#[derive(Debug, Clone)]
pub struct LocalShell {
    root: PathBuf,
    options: ShellOptions,
}

impl LocalShell {
    /// A shell rooted at `root`.
    pub fn new(root: impl Into<PathBuf>, options: ShellOptions) -> Self {
        LocalShell {
            root: root.into(),
            options,
        }
    }

    fn command(&self, line: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(LEADER)
            .arg("hame-sh")
            .arg(line)
            .current_dir(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // The group, not just the leader, is killed: see `Group`.
            .kill_on_drop(false);
        if !self.options.inherit_env {
            cmd.env_clear();
            let path =
                std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_owned());
            cmd.env("PATH", path)
                .env("HOME", &self.root)
                .env("LANG", "C.UTF-8");
        }
        for (k, v) in &self.options.env {
            cmd.env(k, v);
        }
        cmd
    }
}

/// A running command's process group. Until the leader is reaped its pid cannot be reused,
/// so signalling `-pgid` reaches this group and no other; after it is reaped the group is
/// never signalled again. Dropping an unfinished group stops it (`SIGTERM`, `SIGKILL` after
/// the grace, in a background task; at once without a runtime).
struct Group {
    child: Option<Child>,
    pgid: Option<Pid>,
    /// The write end of the leader's stdin; closing it makes the watchdog kill the group.
    lifeline: Option<ChildStdin>,
    grace: Duration,
    reaped: bool,
}

impl Group {
    fn new(mut child: Child, grace: Duration) -> Self {
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw);
        Group {
            lifeline: child.stdin.take(),
            child: Some(child),
            pgid,
            grace,
            reaped: false,
        }
    }

    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid.filter(|_| !self.reaped) {
            // ESRCH (nobody left) is fine.
            let _ = kill_process_group(pgid, signal);
        }
    }

    /// Waits for the leader to exit and reaps it.
    async fn wait(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.wait().await.ok();
        self.reaped = status.is_some();
        status
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.signal(Signal::TERM);
        let (child, lifeline, pgid, grace) = (
            self.child.take(),
            self.lifeline.take(),
            self.pgid,
            self.grace,
        );
        let finish = async move {
            tokio::time::sleep(grace).await;
            if let Some(pgid) = pgid {
                let _ = kill_process_group(pgid, Signal::KILL);
            }
            drop(lifeline);
            if let Some(mut child) = child {
                let _ = child.wait().await;
            }
        };
        match tokio::runtime::Handle::try_current() {
            // If the runtime shuts down before the task runs, dropping it closes the
            // lifeline, and the watchdog kills the group.
            Ok(runtime) => drop(runtime.spawn(finish)),
            Err(_) => self.signal(Signal::KILL),
        }
    }
}

/// Reads `r` to its end into `buf` (at most `cap` bytes kept). Cancel-safe: what was read
/// before the future is dropped stays in `buf`.
async fn drain(r: Option<&mut (impl AsyncRead + Unpin)>, buf: &mut CappedOutput, cap: usize) {
    let Some(r) = r else { return };
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.push(&chunk[..n], cap),
        }
    }
}

/// Drains both pipes (see [`drain`]).
async fn drain_both(
    pipes: &mut (Option<ChildStdout>, Option<ChildStderr>),
    (out, err): (&mut CappedOutput, &mut CappedOutput),
    cap: usize,
) {
    tokio::join!(
        drain(pipes.0.as_mut(), out, cap),
        drain(pipes.1.as_mut(), err, cap)
    );
}

#[async_trait]
impl Execute for LocalShell {
    async fn execute(&self, request: ExecRequest) -> Result<ExecOutput> {
        let timeout = request
            .timeout
            .unwrap_or(self.options.default_timeout)
            .min(self.options.max_timeout);
        let mut child = self
            .command(&request.command)
            .spawn()
            .map_err(|e| Error::backend("cannot start `sh`", e))?;
        let mut pipes = (child.stdout.take(), child.stderr.take());
        let mut group = Group::new(child, self.options.kill_grace);
        let cap = self.options.max_output_bytes;
        let (mut out, mut err) = (CappedOutput::default(), CappedOutput::default());
        let run = async {
            drain_both(&mut pipes, (&mut out, &mut err), cap).await;
            // Reaped only once nothing holds the pipes: until then `-pgid` stays ours.
            group.wait().await
        };
        let (status, timed_out) = match tokio::time::timeout(timeout, run).await {
            Ok(status) => (status, false),
            Err(_) => {
                group.signal(Signal::TERM);
                // The grace ends early once every writer of the pipes is gone.
                let rest = drain_both(&mut pipes, (&mut out, &mut err), cap);
                let _ = tokio::time::timeout(self.options.kill_grace, rest).await;
                group.signal(Signal::KILL);
                let rest = drain_both(&mut pipes, (&mut out, &mut err), cap);
                let _ = tokio::time::timeout(DRAIN_AFTER_KILL, rest).await;
                group.wait().await;
                (None, true)
            }
        };
        let (stdout_bytes, stderr_bytes) = (out.total, err.total);
        let (stdout_truncated, stderr_truncated) = (out.truncated, err.truncated);
        let (output, truncated) = render_output(out, err, cap);
        Ok(ExecOutput {
            output,
            exit_code: status.and_then(|s| s.code()),
            truncated,
            timed_out,
            signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            stdout_bytes,
            stderr_bytes,
            stdout_truncated,
            stderr_truncated,
        })
    }
}

#[cfg(test)]
#[path = "shell_tests.rs"]
mod tests;
