//! The stdio transport: a child process in its own process group whose stdout goes through
//! [`BoundedLines`] before rmcp's line transport reads it (rmcp's `TokioChildProcess` reads
//! the child's stdout directly, and drops an oversized line without a word).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use process_wrap::tokio::{ChildWrapper, CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::process::{ChildStdin, ChildStdout};

use crate::bounded::{BoundedLines, MAX_MESSAGE_BYTES};

/// How long a server may take to exit after its stdin closed, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// The child, killed (its whole process group) when dropped.
struct ChildGuard(Option<Box<dyn ChildWrapper>>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(e) = Box::into_pin(child.kill()).await {
                    tracing::debug!(error = %e, "killing an MCP server");
                }
            });
        }
    }
}

/// A stdio MCP server (see the module docs).
pub(crate) struct StdioTransport {
    child: ChildGuard,
    transport: AsyncRwTransport<RoleClient, BoundedLines<ChildStdout>, ChildStdin>,
}

impl StdioTransport {
    /// Spawns `command` in its own process group, its stderr copied to the log.
    pub(crate) fn spawn(
        server: &str,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&PathBuf>,
    ) -> std::io::Result<Self> {
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(args)
            .envs(env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let mut wrap = CommandWrap::from(cmd);
        wrap.wrap(KillOnDrop).wrap(ProcessGroup::leader());
        let mut child = wrap.spawn()?;
        let parts = (
            child.stdin().take(),
            child.stdout().take(),
            child.stderr().take(),
        );
        let (Some(stdin), Some(stdout), stderr) = parts else {
            return Err(std::io::Error::other("the server's stdio is not piped"));
        };
        if let Some(stderr) = stderr {
            let server = server.to_owned();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "hame_mcp::stderr", server = %server, "{line}");
                }
            });
        }
        // rmcp's own limit is one byte above ours (the newline), so a line it gets is never
        // dropped by it.
        let transport = AsyncRwTransport::new(BoundedLines::new(stdout, MAX_MESSAGE_BYTES), stdin)
            .with_max_line_length(MAX_MESSAGE_BYTES + 1);
        Ok(Self {
            child: ChildGuard(Some(child)),
            transport,
        })
    }
}

impl Transport<RoleClient> for StdioTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.transport.receive()
    }

    /// Closes the server's stdin (MCP's stdio shutdown), waits up to [`EXIT_GRACE`] for it to
    /// exit, then kills its process group.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.transport.close().await?;
        let Some(child) = self.child.0.as_mut() else {
            return Ok(());
        };
        if let Ok(Ok(_)) = tokio::time::timeout(EXIT_GRACE, child.wait()).await {
            self.child.0 = None;
            return Ok(());
        }
        let killed = Box::into_pin(child.kill()).await;
        self.child.0 = None;
        killed
    }
}
