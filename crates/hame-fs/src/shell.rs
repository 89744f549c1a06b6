//! [`LocalShell`]: the [`Execute`] capability on the local machine (`sh -c` in the root).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{Error, Result};
use crate::fs::{ExecOutput, ExecRequest, Execute};

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
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output_bytes: 100_000,
            inherit_env: false,
            env: Vec::new(),
        }
    }
}

/// Runs commands with `sh -c` in a local directory, in their own process group; on timeout
/// the whole group is killed (`SIGKILL` to `-pgid`).
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
}

async fn drain(mut r: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut truncated = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, truncated)
}

#[async_trait]
impl Execute for LocalShell {
    async fn execute(&self, request: ExecRequest) -> Result<ExecOutput> {
        let timeout = request
            .timeout
            .unwrap_or(self.options.default_timeout)
            .min(self.options.max_timeout);
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(&request.command)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
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
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::backend("cannot start `sh`", e))?;
        let pgid = child.id();
        let cap = self.options.max_output_bytes;
        let out = child.stdout.take();
        let err = child.stderr.take();
        let readers = async move {
            let o = async {
                match out {
                    Some(o) => drain(o, cap).await,
                    None => (Vec::new(), false),
                }
            };
            let e = async {
                match err {
                    Some(e) => drain(e, cap).await,
                    None => (Vec::new(), false),
                }
            };
            tokio::join!(o, e)
        };
        let run = async { tokio::join!(readers, child.wait()) };
        let (timed_out, outputs, status) = match tokio::time::timeout(timeout, run).await {
            Ok((outputs, status)) => (false, Some(outputs), status.ok()),
            Err(_) => {
                if let Some(pid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                let _ = child.kill().await;
                (true, None, None)
            }
        };
        let ((stdout, t1), (stderr, t2)) =
            outputs.unwrap_or(((Vec::new(), false), (Vec::new(), false)));
        let mut text = String::from_utf8_lossy(&stdout).into_owned();
        for line in String::from_utf8_lossy(&stderr).lines() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("[stderr] ");
            text.push_str(line);
            text.push('\n');
        }
        let mut truncated = t1 || t2;
        if text.len() > cap {
            let mut cut = cap;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            truncated = true;
        }
        if truncated {
            text.push_str(&format!("\n[output truncated at {cap} bytes]"));
        }
        Ok(ExecOutput {
            output: text,
            exit_code: status.and_then(|s| s.code()),
            truncated,
            timed_out,
        })
    }
}
