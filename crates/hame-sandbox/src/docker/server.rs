//! The command server: a pool of long-lived `sh` processes per container
//! ([`scripts::SERVER`]), so a command in a warm container costs a write and a read on an
//! open stream instead of a `docker exec` (create, start, attach, inspect: ~55 ms of
//! Docker's own time here).
//!
//! A server runs one request at a time. A request taken from the pool goes back only when
//! its answer was read to the end; a server whose call was cancelled, timed out without a
//! clean answer, or broke the framing is dropped (its stream closes, its `sh` exits).

use std::time::Duration;

use base64::Engine as _;
use tokio::io::AsyncWriteExt;

use super::exec::{Output, Raw};
use super::{Shared, scripts};
use crate::error::{Error, Result};
use hame_fs::CappedOutput;

/// Most idle servers kept per container.
const POOL_PER_CONTAINER: usize = 8;

/// How long the controller may take to answer one request before it counts as gone.
const CONTROLLER_ANSWER: Duration = Duration::from_secs(2);

/// The controller of a container ([`scripts::CONTROLLER`]), when it runs: one request at a
/// time.
pub(crate) type ControlSlot = std::sync::Arc<tokio::sync::Mutex<Option<Server>>>;

/// One server process and its open stream.
pub(crate) struct Server {
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    output: Output,
    /// Bytes of stdout read but not consumed yet.
    buf: Vec<u8>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

fn protocol(message: impl Into<String>) -> Error {
    Error::Backend {
        message: format!("sandbox command server: {}", message.into()),
        source: None,
    }
}

/// `text` quoted for `sh` (single quotes; a quote inside becomes `'\''`).
pub(crate) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The command text of a script with arguments, run by the server as `sh FILE`:
/// `HAME_FAST` (the largest output the script may send this way), the arguments, the
/// script.
pub(crate) fn script_text(script: &str, args: &[&str]) -> String {
    let mut text = format!("HAME_FAST={}\nset --", scripts::FAST_OUTPUT_BYTES);
    for a in args {
        text.push(' ');
        text.push_str(&quote(a));
    }
    text.push('\n');
    text.push_str(script);
    text.push('\n');
    text
}

/// What one request came to.
pub(crate) struct Answer {
    pub(crate) raw: Raw,
    pub(crate) timed_out: bool,
}

impl Server {
    /// Reads at least one more chunk of stdout into the buffer.
    async fn fill(&mut self) -> Result<()> {
        use futures::StreamExt as _;
        loop {
            match self.output.next().await {
                Some(Ok(bollard::container::LogOutput::StdOut { message }))
                | Some(Ok(bollard::container::LogOutput::Console { message })) => {
                    self.buf.extend_from_slice(&message);
                    return Ok(());
                }
                Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                    tracing::debug!(stderr = %String::from_utf8_lossy(&message), "sandbox command server");
                }
                Some(Ok(bollard::container::LogOutput::StdIn { .. })) => {}
                Some(Err(e)) => {
                    return Err(Error::backend(
                        "reading from the sandbox command server failed",
                        e,
                    ));
                }
                None => return Err(protocol("the server ended")),
            }
        }
    }

    async fn line(&mut self) -> Result<String> {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let rest = self.buf.split_off(at + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                return String::from_utf8(line).map_err(|_| protocol("a line is not UTF-8"));
            }
            if self.buf.len() > 4096 {
                return Err(protocol("an over-long header line"));
            }
            self.fill().await?;
        }
    }

    async fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill().await?;
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    async fn send(&mut self, token: &str, text: &str, stdin: &[u8], cap: usize) -> Result<()> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
        let mut request = format!("{token} {} {cap} {b64}\n", stdin.len()).into_bytes();
        request.extend_from_slice(stdin);
        self.input
            .write_all(&request)
            .await
            .map_err(|e| Error::backend("writing to the sandbox command server failed", e))?;
        self.input
            .flush()
            .await
            .map_err(|e| Error::backend("writing to the sandbox command server failed", e))
    }

    /// One request to a controller: `signal` (`TERM` or `KILL`) to the process group of the
    /// command `token`; returns its answer (`sent`, `gone`, `none`).
    async fn signal(&mut self, signal: &str, token: &str) -> Result<String> {
        self.input
            .write_all(format!("{signal} {token}\n").as_bytes())
            .await
            .map_err(|e| Error::backend("writing to the sandbox controller failed", e))?;
        self.input
            .flush()
            .await
            .map_err(|e| Error::backend("writing to the sandbox controller failed", e))?;
        self.line().await
    }

    /// Reads `P <pid>`.
    async fn started(&mut self) -> Result<()> {
        let line = self.line().await?;
        match line.strip_prefix("P ") {
            Some(pid) if pid.parse::<u32>().is_ok() => Ok(()),
            _ => Err(protocol(format!("unexpected answer {line:?}"))),
        }
    }

    /// Waits until a whole line is buffered (cancel-safe: consumes nothing).
    async fn line_ready(&mut self) -> Result<()> {
        while !self.buf.contains(&b'\n') {
            if self.buf.len() > 4096 {
                return Err(protocol("an over-long header line"));
            }
            self.fill().await?;
        }
        Ok(())
    }

    /// Reads `D ...`, the outputs and `E`.
    async fn finished(&mut self) -> Result<Raw> {
        let line = self.line().await?;
        let fields: Vec<u64> = line
            .strip_prefix("D ")
            .map(|rest| rest.split(' ').filter_map(|f| f.parse().ok()).collect())
            .unwrap_or_default();
        let [exit, so, se, ko, ke] = fields[..] else {
            return Err(protocol(format!("unexpected answer {line:?}")));
        };
        let to_usize = |n: u64| usize::try_from(n).map_err(|_| protocol("an output too large"));
        let stdout = self.bytes(to_usize(ko)?).await?;
        let stderr = self.bytes(to_usize(ke)?).await?;
        let end = self.line().await?;
        if end != "E" {
            return Err(protocol(format!("unexpected end {end:?}")));
        }
        Ok(Raw {
            stdout: CappedOutput {
                kept: stdout,
                truncated: so > ko,
                total: so,
            },
            stderr: CappedOutput {
                kept: stderr,
                truncated: se > ke,
                total: se,
            },
            exit: i64::try_from(exit).ok(),
        })
    }
}

impl Shared {
    /// An idle server of `container`, or a new one.
    async fn server(&self, container: &str) -> Result<Server> {
        if let Some(s) = self
            .servers
            .lock()
            .ok()
            .and_then(|mut pool| pool.get_mut(container).and_then(Vec::pop))
        {
            return Ok(s);
        }
        let cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            scripts::SERVER.to_owned(),
            "hame-server".to_owned(),
            scripts::REAP_POLLS.to_string(),
        ];
        let (_, output, input) = self.start_exec(container, cmd, true).await?;
        Ok(Server {
            input,
            output,
            buf: Vec::new(),
        })
    }

    fn park(&self, container: &str, server: Server) {
        if let Ok(mut pool) = self.servers.lock() {
            let idle = pool.entry(container.to_owned()).or_default();
            if idle.len() < POOL_PER_CONTAINER {
                idle.push(server);
            }
        }
    }

    /// Starts one server for `container` ahead of its first command.
    pub(crate) async fn warm(&self, container: &str) {
        match self.server(container).await {
            Ok(s) => self.park(container, s),
            Err(e) => tracing::debug!(error = %e, "warming the sandbox command server failed"),
        }
    }

    /// Forgets the servers and the controller of a container that is being removed (their
    /// streams close, their shells end).
    pub(crate) fn forget_servers(&self, container: &str) {
        if let Ok(mut pool) = self.servers.lock() {
            pool.remove(container);
        }
        if let Ok(mut controllers) = self.controllers.lock() {
            controllers.remove(container);
        }
    }

    /// The controller slot of `container`.
    pub(crate) fn control_slot(&self, container: &str) -> ControlSlot {
        let mut controllers = match self.controllers.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        controllers.entry(container.to_owned()).or_default().clone()
    }

    /// Starts the controller of `container` unless it runs (or is being started, or is busy
    /// killing a command). It has to exist before a user command starts: once a fork bomb
    /// runs, nothing new starts in the container. (Started in the background when the
    /// container is started or adopted, so neither the restore nor the first command waits
    /// for it; started here again after it died.)
    pub(crate) async fn ensure_controller(&self, container: &str) {
        let slot = self.control_slot(container);
        let Ok(mut controller) = slot.try_lock() else {
            return;
        };
        if controller.is_some() {
            return;
        }
        let cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            scripts::CONTROLLER.to_owned(),
        ];
        match self.start_exec(container, cmd, true).await {
            Ok((_, output, input)) => {
                *controller = Some(Server {
                    input,
                    output,
                    buf: Vec::new(),
                });
            }
            Err(e) => tracing::debug!(error = %e, "starting the sandbox controller failed"),
        }
    }

    /// Runs the command `text` through a server of `container` with `stdin`, keeping `cap`
    /// bytes of each output. Past `timeout` the command's process group is killed and what
    /// it printed until then is returned (`timed_out`). Cancel-safe: dropping the future
    /// kills the command (the guard) and drops the server.
    pub(crate) async fn serve(
        &self,
        container: &str,
        text: &str,
        stdin: &[u8],
        cap: usize,
        timeout: Duration,
    ) -> Result<Answer> {
        let token = self.token();
        let mut server = self.server(container).await?;
        let mut guard = self.kill_guard(container, &token);
        let deadline = tokio::time::Instant::now() + timeout;
        // 0: sending, 1: waiting for `P`, 2: running, 3: reading the answer.
        let mut phase = 0u8;
        let call = async {
            server.send(&token, text, stdin, cap).await?;
            phase = 1;
            server.started().await?;
            phase = 2;
            server.line_ready().await?;
            phase = 3;
            server.finished().await
        };
        let outcome = tokio::time::timeout_at(deadline, call).await;
        match outcome {
            Ok(Ok(raw)) => {
                guard.disarm();
                self.park(container, server);
                Ok(Answer {
                    raw,
                    timed_out: false,
                })
            }
            // The command may still run: the guard kills its group.
            Ok(Err(e)) => Err(e),
            Err(_) => {
                self.kill_group(container, &token).await;
                guard.disarm();
                // Once the group is dead the server answers with what the command printed;
                // a server that does not (or whose answer was half read) is dropped. A
                // command that had not started at the first kill is killed once it has.
                let rest = async {
                    if phase == 1 {
                        server.started().await?;
                        self.kill_group(container, &token).await;
                    }
                    server.finished().await
                };
                let bound = self.options.kill_grace * 4 + Duration::from_secs(1);
                let raw = if phase == 1 || phase == 2 {
                    match tokio::time::timeout(bound, rest).await {
                        Ok(Ok(raw)) => {
                            self.park(container, server);
                            raw
                        }
                        _ => Raw::default(),
                    }
                } else {
                    Raw::default()
                };
                Ok(Answer {
                    raw: Raw { exit: None, ..raw },
                    timed_out: true,
                })
            }
        }
    }
}

/// Sends `signal` to the group of the command `token` through the controller in `slot`:
/// its answer, or `None` when there is no controller or it did not answer (it is dropped
/// then, and started again before the next command).
pub(crate) async fn signal_via(slot: &ControlSlot, signal: &str, token: &str) -> Option<String> {
    let mut controller = slot.lock().await;
    let answer = match controller.as_mut() {
        Some(c) => tokio::time::timeout(CONTROLLER_ANSWER, c.signal(signal, token)).await,
        None => return None,
    };
    match answer {
        Ok(Ok(answer)) => Some(answer),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "the sandbox controller is gone");
            *controller = None;
            None
        }
        Err(_) => {
            tracing::debug!("the sandbox controller did not answer");
            *controller = None;
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_every_byte_but_nul() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        let text = script_text(
            "printf '%s|' \"$@\"",
            &["x y", "'; rm -rf /", "$(id)", "\n"],
        );
        assert!(
            text.starts_with("HAME_FAST=8388608\nset -- 'x y' ''\\''; rm -rf /' '$(id)' '\n'\n")
        );
    }
}
