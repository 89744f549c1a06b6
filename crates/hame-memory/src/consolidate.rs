//! Consolidation: merging what the daily logs gained since the last run into `MEMORY.md`
//! with the model, validating the result before it replaces the file.
//!
//! Only the new part of each log is sent (logs are append-only, so the state file records
//! how many bytes of each were consumed). The answer must be non-empty, start with the
//! header line and fit the token budget; otherwise nothing is written. The previous
//! `MEMORY.md` is kept as `memory/MEMORY.previous.md`.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use hame_core::{Message, Model, ModelParams, ModelRequest, StopReason};
use serde::{Deserialize, Serialize};

use crate::compaction::clip_middle;
use crate::daily::{MEMORY_DIR, MEMORY_FILE, MemoryFiles, parse_daily_log_path};
use crate::error::{Error, Result};
use crate::tokens::TokenCounter;

/// Default token budget of `MEMORY.md`.
pub const DEFAULT_MEMORY_TOKEN_BUDGET: u64 = 4_000;
/// Default minimum time between consolidations.
pub const DEFAULT_MIN_INTERVAL_MINUTES: i64 = 30;
/// Default header line `MEMORY.md` must start with.
pub const DEFAULT_HEADER: &str = "# Memory";
/// Default cap on new log text sent in one run (characters); the rest waits for the next.
pub const DEFAULT_MAX_INPUT_CHARS: usize = 60_000;
/// Where the consolidation state is kept.
pub const STATE_PATH: &str = "memory/.consolidation.json";
/// Where the previous `MEMORY.md` is kept.
pub const BACKUP_PATH: &str = "memory/MEMORY.previous.md";

/// The system prompt of consolidation calls.
pub const CONSOLIDATION_SYSTEM_PROMPT: &str = "You maintain an agent's long-term memory \
file. You merge newly logged facts into it: remove duplicates, combine related facts under \
section headings, update or drop facts that newer ones supersede, and prefer recent and \
frequently confirmed facts when space is short. Never invent facts. Output the complete \
new file and nothing else.";

/// At most one run per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottlePolicy {
    /// Minimum time between runs. Default [`DEFAULT_MIN_INTERVAL_MINUTES`].
    pub min_interval: Duration,
}

impl Default for ThrottlePolicy {
    fn default() -> Self {
        Self {
            min_interval: Duration::minutes(DEFAULT_MIN_INTERVAL_MINUTES),
        }
    }
}

impl ThrottlePolicy {
    /// Whether a run at `now` is allowed after one at `last`. A `last` in the future (clock
    /// skew between replicas) allows a run.
    pub fn allows(&self, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        match last {
            None => true,
            Some(l) if l > now => true,
            Some(l) => now - l >= self.min_interval,
        }
    }
}

/// Settings of a [`Consolidator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsolidationOptions {
    /// Token budget of `MEMORY.md`. Default [`DEFAULT_MEMORY_TOKEN_BUDGET`].
    pub token_budget: u64,
    /// Throttle. Default every [`DEFAULT_MIN_INTERVAL_MINUTES`] minutes at most.
    pub throttle: ThrottlePolicy,
    /// The first line of `MEMORY.md`. Default [`DEFAULT_HEADER`].
    pub header: String,
    /// Cap on new log text per run. Default [`DEFAULT_MAX_INPUT_CHARS`].
    pub max_input_chars: usize,
}

impl Default for ConsolidationOptions {
    fn default() -> Self {
        Self {
            token_budget: DEFAULT_MEMORY_TOKEN_BUDGET,
            throttle: ThrottlePolicy::default(),
            header: DEFAULT_HEADER.to_owned(),
            max_input_chars: DEFAULT_MAX_INPUT_CHARS,
        }
    }
}

/// The consolidation state file ([`STATE_PATH`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsolidationState {
    /// When the last run started (throttle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<DateTime<Utc>>,
    /// Bytes of each daily log already merged.
    #[serde(default)]
    pub consumed: BTreeMap<String, usize>,
}

/// What a consolidation did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsolidationOutcome {
    /// The throttle refused the run.
    Throttled,
    /// No daily log gained text since the last run; no model call.
    NothingNew,
    /// `MEMORY.md` was rewritten.
    Updated {
        /// Logs that contributed.
        logs: Vec<String>,
        /// Tokens of the new `MEMORY.md`.
        tokens: u64,
        /// Whether some new log text was left for the next run (input cap).
        more: bool,
    },
}

/// Merges daily logs into `MEMORY.md`. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Consolidator {
    files: Arc<dyn MemoryFiles>,
    model: Arc<dyn Model>,
    counter: Arc<dyn TokenCounter>,
    options: ConsolidationOptions,
}

/// Strips a Markdown code fence the model may have wrapped the file in.
fn unfence(text: &str) -> &str {
    let t = text.trim();
    if let Some(rest) = t.strip_prefix("```") {
        let body = rest.split_once('\n').map_or("", |(_, b)| b);
        return body.trim_end().strip_suffix("```").unwrap_or(body).trim();
    }
    t
}

impl Consolidator {
    /// A consolidator over `files`, asking `model`, measuring with `counter`.
    pub fn new(
        files: Arc<dyn MemoryFiles>,
        model: Arc<dyn Model>,
        counter: Arc<dyn TokenCounter>,
        options: ConsolidationOptions,
    ) -> Self {
        Self {
            files,
            model,
            counter,
            options,
        }
    }

    /// Checks a proposed `MEMORY.md`: fences removed, non-empty, starts with the header
    /// line, within the token budget. Returns the text to write.
    pub fn validate(&self, proposed: &str) -> Result<String> {
        let text = unfence(proposed);
        let refuse = |reason: String| Error::UnusableOutput {
            purpose: "consolidation",
            reason,
        };
        if text.is_empty() {
            return Err(refuse("the new MEMORY.md is empty".into()));
        }
        let first = text.lines().next().unwrap_or_default().trim();
        if first != self.options.header.trim() {
            return Err(refuse(format!(
                "the new MEMORY.md must start with `{}`, it starts with `{}`",
                self.options.header,
                clip_middle(first, 80)
            )));
        }
        if text.lines().skip(1).all(|l| l.trim().is_empty()) {
            return Err(refuse(
                "the new MEMORY.md has a header and nothing else".into(),
            ));
        }
        let tokens = self.counter.count(text);
        if tokens > self.options.token_budget {
            return Err(refuse(format!(
                "the new MEMORY.md has {tokens} tokens, over the budget of {}",
                self.options.token_budget
            )));
        }
        Ok(format!("{text}\n"))
    }

    async fn load_state(&self) -> ConsolidationState {
        match self.files.read(STATE_PATH).await {
            Ok(Some(text)) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "unreadable consolidation state; starting over");
                ConsolidationState::default()
            }),
            Ok(None) => ConsolidationState::default(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the consolidation state; starting over");
                ConsolidationState::default()
            }
        }
    }

    /// Runs if the throttle allows.
    pub async fn consolidate_if_due(&self, now: DateTime<Utc>) -> Result<ConsolidationOutcome> {
        let state = self.load_state().await;
        if !self.options.throttle.allows(state.last_run, now) {
            return Ok(ConsolidationOutcome::Throttled);
        }
        self.run(state, now).await
    }

    /// Runs now, whatever the throttle says.
    pub async fn consolidate(&self, now: DateTime<Utc>) -> Result<ConsolidationOutcome> {
        let state = self.load_state().await;
        self.run(state, now).await
    }

    async fn run(
        &self,
        mut state: ConsolidationState,
        now: DateTime<Utc>,
    ) -> Result<ConsolidationOutcome> {
        let mut logs: Vec<String> = self
            .files
            .list(MEMORY_DIR)
            .await?
            .into_iter()
            .filter(|p| parse_daily_log_path(p).is_some())
            .collect();
        logs.sort();
        let mut input = String::new();
        let mut used: Vec<(String, usize)> = Vec::new();
        let mut more = false;
        for path in logs {
            let Some(text) = self.files.read(&path).await? else {
                continue;
            };
            let done = state.consumed.get(&path).copied().unwrap_or(0);
            let start = if done <= text.len() && text.is_char_boundary(done) {
                done
            } else {
                0
            };
            let delta = &text[start..];
            if delta.trim().is_empty() {
                continue;
            }
            if !input.is_empty() && input.len() + delta.len() > self.options.max_input_chars {
                more = true;
                break;
            }
            input.push_str(&format!("### {path}\n{}\n\n", delta.trim()));
            used.push((path, text.len()));
        }
        if used.is_empty() {
            return Ok(ConsolidationOutcome::NothingNew);
        }
        let current = self.files.read(MEMORY_FILE).await?.unwrap_or_default();
        let budget = self.options.token_budget;
        let prompt = format!(
            "Current MEMORY.md:\n<<<\n{}\n>>>\n\nNew log entries:\n<<<\n{}>>>\n\nWrite the \
             complete new MEMORY.md. Its first line must be exactly `{}`. Stay within {budget} \
             tokens (about {} characters).",
            if current.trim().is_empty() {
                "(empty)"
            } else {
                current.trim()
            },
            clip_middle(&input, self.options.max_input_chars),
            self.options.header,
            budget * 4,
        );
        let request = ModelRequest {
            system: CONSOLIDATION_SYSTEM_PROMPT.to_owned(),
            messages: vec![Message::user(prompt)],
            tools: Vec::new(),
            params: ModelParams {
                temperature: None,
                max_tokens: Some(u32::try_from(budget + budget / 2).unwrap_or(u32::MAX)),
            },
            cache_key: None,
        };
        let response = self
            .model
            .complete(request)
            .await
            .map_err(|source| Error::Model {
                purpose: "consolidation",
                source,
            })?;
        if response.stop_reason == Some(StopReason::MaxTokens) {
            return Err(Error::UnusableOutput {
                purpose: "consolidation",
                reason: "the new MEMORY.md was cut off at the output limit".into(),
            });
        }
        let text = self.validate(&response.message.text_content())?;
        let tokens = self.counter.count(&text);
        if !current.trim().is_empty() {
            self.files.write_atomic(BACKUP_PATH, &current).await?;
        }
        self.files.write_atomic(MEMORY_FILE, &text).await?;
        for (path, len) in &used {
            state.consumed.insert(path.clone(), *len);
        }
        state.last_run = Some(now);
        let json = serde_json::to_string_pretty(&state).map_err(|e| {
            Error::files_with(STATE_PATH, "cannot serialise the consolidation state", e)
        })?;
        self.files.write_atomic(STATE_PATH, &json).await?;
        tracing::info!(logs = used.len(), tokens, "MEMORY.md consolidated");
        Ok(ConsolidationOutcome::Updated {
            logs: used.into_iter().map(|(p, _)| p).collect(),
            tokens,
            more,
        })
    }
}

#[cfg(test)]
#[path = "consolidate_tests.rs"]
mod tests;
