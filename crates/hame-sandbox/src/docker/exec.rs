//! Running processes in a container (`docker exec` through the API).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::{Stream, StreamExt};
use hame_fs::{CappedOutput, render_output};
use tokio::io::AsyncWriteExt;

use super::{SANDBOX_USER, Shared, scripts};
use crate::error::{Error, Result};

/// The whole environment of the container and of every process in it: nothing of the
/// host's (no API key can leak in).
pub(crate) fn base_env() -> Vec<String> {
    vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_owned(),
        "HOME=/workspace".to_owned(),
        "LANG=C.UTF-8".to_owned(),
    ]
}

/// What a process printed and how it ended.
#[derive(Debug, Default)]
pub(crate) struct Raw {
    pub(crate) stdout: CappedOutput,
    pub(crate) stderr: CappedOutput,
    pub(crate) exit: Option<i64>,
}

pub(crate) type Output =
    Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// Reads `output` to its end into the buffers (cancel-safe: what was read stays).
async fn drain(
    output: &mut Output,
    out: &mut CappedOutput,
    err: &mut CappedOutput,
    cap: usize,
) -> Result<()> {
    while let Some(item) = output.next().await {
        match item
            .map_err(|e| Error::backend("reading the output of a sandbox process failed", e))?
        {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                out.push(&message, cap)
            }
            LogOutput::StdErr { message } => err.push(&message, cap),
            LogOutput::StdIn { .. } => {}
        }
    }
    Ok(())
}

impl Shared {
    pub(crate) async fn start_exec(
        &self,
        container: &str,
        cmd: Vec<String>,
        stdin: bool,
    ) -> Result<(String, Output, Pin<Box<dyn tokio::io::AsyncWrite + Send>>)> {
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(cmd),
                    user: Some(SANDBOX_USER.to_owned()),
                    working_dir: Some("/workspace".to_owned()),
                    env: Some(base_env()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| Error::backend("creating a process in the sandbox failed", e))?;
        match self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| Error::backend("starting a process in the sandbox failed", e))?
        {
            StartExecResults::Attached { output, input } => Ok((exec.id, output, input)),
            StartExecResults::Detached => Err(Error::Backend {
                message: "the sandbox process started detached".into(),
                source: None,
            }),
        }
    }

    async fn exit_code(&self, exec: &str) -> Option<i64> {
        for _ in 0..50 {
            match self.docker.inspect_exec(exec).await {
                Ok(i) if i.running != Some(true) => return i.exit_code,
                Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(_) => return None,
            }
        }
        None
    }

    /// Runs `cmd` to its end with `stdin` as its input; keeps at most `cap` bytes of each
    /// output stream.
    pub(crate) async fn run(
        &self,
        container: &str,
        cmd: Vec<String>,
        stdin: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Raw> {
        let (exec, mut output, mut input) =
            self.start_exec(container, cmd, stdin.is_some()).await?;
        let write = async move {
            if let Some(data) = stdin {
                let sent = input.write_all(&data).await;
                let _ = input.shutdown().await;
                sent.map_err(|e| Error::backend("writing to a sandbox process failed", e))?;
            }
            Ok::<(), Error>(())
        };
        let mut raw = Raw::default();
        let read = drain(&mut output, &mut raw.stdout, &mut raw.stderr, cap);
        let (w, r) = tokio::join!(write, read);
        r?;
        w?;
        raw.exit = self.exit_code(&exec).await;
        Ok(raw)
    }

    /// A shell script with arguments, through the container's command server when its
    /// input is small (a script that would send more than
    /// [`scripts::FAST_OUTPUT_BYTES`] exits [`scripts::TOO_BIG`] and runs again as its
    /// own exec).
    pub(crate) async fn script(
        &self,
        container: &str,
        script: &str,
        args: &[&str],
        stdin: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Raw> {
        let input = stdin.as_deref().unwrap_or_default();
        if input.len() as u64 <= scripts::FAST_OUTPUT_BYTES {
            let text = super::server::script_text(script, args);
            let answer = self
                .serve(container, &text, input, cap, self.options.max_timeout)
                .await?;
            if answer.timed_out {
                return Err(Error::Backend {
                    message: format!(
                        "a sandbox file operation took longer than {:?}",
                        self.options.max_timeout
                    ),
                    source: None,
                });
            }
            if answer.raw.exit != Some(scripts::TOO_BIG) {
                return Ok(answer.raw);
            }
        }
        self.script_exec(container, script, args, stdin, cap).await
    }

    /// A shell script with arguments as its own `docker exec` (`sh -c SCRIPT name
    /// args...`): for inputs and outputs too large for the command server.
    pub(crate) async fn script_exec(
        &self,
        container: &str,
        script: &str,
        args: &[&str],
        stdin: Option<Vec<u8>>,
        cap: usize,
    ) -> Result<Raw> {
        let mut cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            script.to_owned(),
            "hame".to_owned(),
        ];
        cmd.extend(args.iter().map(|a| (*a).to_owned()));
        self.run(container, cmd, stdin, cap).await
    }

    pub(crate) fn token(&self) -> String {
        format!(
            "{}-{}",
            std::process::id(),
            self.counter.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// Runs a user command through the container's command server: its process group is
    /// killed on timeout (and when the future is dropped), and the output printed until
    /// then is returned. When the command exits, what is left of its process group
    /// (background jobs) is killed.
    pub(crate) async fn execute(
        &self,
        container: &str,
        command: &str,
        timeout: Duration,
    ) -> Result<hame_fs::ExecOutput> {
        let cap = self.options.max_output_bytes;
        self.ensure_controller(container).await;
        let answer = self.serve(container, command, &[], cap, timeout).await?;
        let Raw {
            stdout,
            stderr,
            exit,
        } = answer.raw;
        let (stdout_bytes, stderr_bytes) = (stdout.total, stderr.total);
        let (stdout_truncated, stderr_truncated) = (stdout.truncated, stderr.truncated);
        let (text, truncated) = render_output(stdout, stderr, cap);
        Ok(hame_fs::ExecOutput {
            output: text,
            exit_code: exit.and_then(|c| i32::try_from(c).ok()),
            truncated,
            timed_out: answer.timed_out,
            signal: None,
            stdout_bytes,
            stderr_bytes,
            stdout_truncated,
            stderr_truncated,
        })
    }

    /// A guard that kills the process group of the command `token` when dropped armed.
    pub(crate) fn kill_guard(&self, container: &str, token: &str) -> KillOnDrop {
        KillOnDrop {
            killer: Some(self.killer(container, token)),
        }
    }

    /// Kills the process group of the command `token`: `SIGTERM`, then `SIGKILL` after the
    /// kill grace.
    pub(crate) async fn kill_group(&self, container: &str, token: &str) {
        self.killer(container, token).kill().await;
    }

    fn killer(&self, container: &str, token: &str) -> GroupKiller {
        GroupKiller {
            docker: self.docker.clone(),
            controller: self.control_slot(container),
            container: container.to_owned(),
            token: token.to_owned(),
            grace: self.options.kill_grace,
        }
    }
}

/// What it takes to kill one command's process group, detached from [`Shared`] so a guard
/// can do it from a task of its own.
pub(crate) struct GroupKiller {
    docker: bollard::Docker,
    controller: super::server::ControlSlot,
    container: String,
    token: String,
    grace: Duration,
}

impl GroupKiller {
    /// Through the container's controller (no new process: works while a fork bomb holds
    /// every pid); without one, as its own `docker exec` of [`scripts::KILL_GROUP`].
    async fn kill(self) {
        use super::server::signal_via;
        match signal_via(&self.controller, "TERM", &self.token)
            .await
            .as_deref()
        {
            Some("sent") => {
                tokio::time::sleep(self.grace).await;
                if signal_via(&self.controller, "KILL", &self.token)
                    .await
                    .is_some()
                {
                    return;
                }
            }
            Some(_) => return,
            None => {}
        }
        let cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            scripts::KILL_GROUP.to_owned(),
            self.token,
            self.grace.as_micros().to_string(),
        ];
        let options = CreateExecOptions {
            cmd: Some(cmd),
            user: Some(SANDBOX_USER.to_owned()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        match self.docker.create_exec(&self.container, options).await {
            Ok(exec) => {
                if let Ok(StartExecResults::Attached { mut output, .. }) =
                    self.docker.start_exec(&exec.id, None).await
                {
                    while output.next().await.is_some() {}
                }
            }
            Err(e) => tracing::warn!(error = %e, "killing a sandbox command failed"),
        }
    }
}

/// Kills a command's process group when its future is dropped before it ended.
pub(crate) struct KillOnDrop {
    killer: Option<GroupKiller>,
}

impl KillOnDrop {
    /// The command ended (or was killed): nothing to do on drop.
    pub(crate) fn disarm(&mut self) {
        self.killer = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(killer) = self.killer.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(killer.kill());
    }
}
