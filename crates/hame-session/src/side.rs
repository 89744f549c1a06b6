//! Side files of a session: JSON-lines files next to its log for what is not a chat
//! message — the action observations (`<session>.observations.jsonl`), the evidence of
//! the verifiers (`<session>.evidence.jsonl`) and the context manifests
//! (`<session>.context.jsonl`). Like the log they are append-only and live in the
//! caller's records (runtime roots the file tools cannot write).

use hame_core::Observation;
use hame_fs::{AppendOptions, FsPath};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::id::validate_id;
use crate::log::SessionLog;

/// Suffix of a session's observations file (`<sessionId>.observations.jsonl`).
pub const OBSERVATIONS_SUFFIX: &str = ".observations.jsonl";
/// Suffix of a session's evidence file (`<sessionId>.evidence.jsonl`).
pub const EVIDENCE_SUFFIX: &str = ".evidence.jsonl";
/// Suffix of a session's context manifests (`<sessionId>.context.jsonl`).
pub const CONTEXT_SUFFIX: &str = ".context.jsonl";

impl SessionLog {
    /// The path of the side file of `session_id` with `suffix` (after validating the id).
    pub fn side_path(&self, session_id: &str, suffix: &str) -> Result<FsPath> {
        validate_id("session id", session_id)?;
        Ok(self.dir().join(&format!("{session_id}{suffix}"))?)
    }

    /// Appends `items` as JSON lines to the side file `suffix` of the session, in one
    /// append. The chunk starts with a newline, so it never glues onto a torn last line
    /// (readers skip empty and unparseable lines). With [`AppendOptions::atomic`] the
    /// lines are not flushed; [`sync_side`](Self::sync_side) flushes them.
    pub async fn append_side<T: Serialize>(
        &self,
        session_id: &str,
        suffix: &str,
        items: &[T],
        options: AppendOptions,
    ) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let path = self.side_path(session_id, suffix)?;
        let mut chunk = Vec::with_capacity(256 * items.len() + 1);
        chunk.push(b'\n');
        for item in items {
            serde_json::to_writer(&mut chunk, item).map_err(|e| Error::Corrupt {
                path: path.to_string(),
                reason: format!("cannot encode a line: {e}"),
            })?;
            chunk.push(b'\n');
        }
        self.fs().append(&path, chunk, options).await?;
        Ok(())
    }

    /// Flushes the side file `suffix` of the session to the device (nothing when it does
    /// not exist).
    pub async fn sync_side(&self, session_id: &str, suffix: &str) -> Result<()> {
        let path = self.side_path(session_id, suffix)?;
        match self.fs().stat(&path).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        self.fs()
            .append(&path, Vec::new(), AppendOptions::default())
            .await?;
        Ok(())
    }

    /// Every line of the side file `suffix` of the session that parses as `T`, in order
    /// (empty when there is no such file). A torn or foreign line is skipped with a warning.
    pub async fn read_side<T: DeserializeOwned>(
        &self,
        session_id: &str,
        suffix: &str,
    ) -> Result<Vec<T>> {
        let path = self.side_path(session_id, suffix)?;
        let data = match self.fs().read_bytes(&path).await {
            Ok(d) => d,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for line in data.split(|b| *b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice(line) {
                Ok(v) => out.push(v),
                Err(e) => tracing::warn!(path = %path, error = %e, "skipping an unreadable line"),
            }
        }
        Ok(out)
    }

    /// Appends observations to `<session>.observations.jsonl` ([`append_side`](Self::append_side)).
    pub async fn append_observations(
        &self,
        session_id: &str,
        observations: &[Observation],
        options: AppendOptions,
    ) -> Result<()> {
        self.append_side(session_id, OBSERVATIONS_SUFFIX, observations, options)
            .await
    }

    /// The session's observations, in the order they were written.
    pub async fn read_observations(&self, session_id: &str) -> Result<Vec<Observation>> {
        self.read_side(session_id, OBSERVATIONS_SUFFIX).await
    }
}
