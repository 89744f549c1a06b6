//! Connections shared by the calls of one process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::client::{ClientOptions, McpClient, ServerConfig};
use crate::{Error, Result};

/// How long a server that failed to start is left alone before the next attempt.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

type SharedSlot = Arc<Mutex<Option<Slot>>>;

#[derive(Debug)]
enum Slot {
    Up(Arc<McpClient>),
    Failed { at: Instant, message: String },
}

/// Connections by server configuration: started lazily by the first call that needs
/// one, shared by every later call (one connection per distinct configuration, so two
/// tenants whose `tools.json` name the same server with the same settings share it). A
/// closed connection is restarted; a server that failed to start is retried after
/// [`RETRY_AFTER`] (calls in between get the first error again, marked as not new).
#[derive(Debug, Default)]
pub struct McpPool {
    slots: Mutex<HashMap<(ServerConfig, ClientOptions), SharedSlot>>,
}

impl McpPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// The connection to `server`, starting it if needed. `Err((error, fresh))`:
    /// `fresh` is true when this attempt failed now (not a remembered failure), so the
    /// caller warns once per attempt.
    pub async fn get(
        &self,
        server: &ServerConfig,
        options: &ClientOptions,
    ) -> std::result::Result<Arc<McpClient>, (Error, bool)> {
        let slot = {
            let mut slots = self.slots.lock().await;
            slots.entry((server.clone(), *options)).or_default().clone()
        };
        let mut guard = slot.lock().await;
        match guard.as_ref() {
            Some(Slot::Up(c)) if !c.is_closed() => return Ok(c.clone()),
            Some(Slot::Failed { at, message }) if at.elapsed() < RETRY_AFTER => {
                return Err((
                    Error::Start {
                        server: server.name.clone(),
                        message: message.clone(),
                    },
                    false,
                ));
            }
            _ => {}
        }
        match connect(server, options).await {
            Ok(c) => {
                let c = Arc::new(c);
                *guard = Some(Slot::Up(c.clone()));
                Ok(c)
            }
            Err(e) => {
                let message = match &e {
                    Error::Start { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                *guard = Some(Slot::Failed {
                    at: Instant::now(),
                    message,
                });
                Err((e, true))
            }
        }
    }

    /// Ends every connection (stdio children are killed).
    pub async fn shutdown(&self) {
        let slots: Vec<_> = self.slots.lock().await.drain().map(|(_, s)| s).collect();
        for slot in slots {
            if let Some(Slot::Up(c)) = slot.lock().await.take()
                && let Ok(c) = Arc::try_unwrap(c)
            {
                c.shutdown().await;
            }
        }
    }
}

/// Connects and lists the tools once, so a server that starts but cannot list its tools
/// counts as not started.
async fn connect(server: &ServerConfig, options: &ClientOptions) -> Result<McpClient> {
    let client = McpClient::connect(server, options).await?;
    client.tools().await.map_err(|e| Error::Start {
        server: server.name.clone(),
        message: e.to_string(),
    })?;
    Ok(client)
}
