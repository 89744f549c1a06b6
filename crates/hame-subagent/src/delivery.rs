//! Delivery of finished results to the parent: durable before acknowledged (ADR 0024).
//!
//! A result reaches the parent's conversation during one of its calls — pushed as a
//! `<system-notification>`, returned by `task_output` or by a sync `agent_spawn` — and its
//! task record is marked delivered only once that call's state is saved:
//!
//! 1. **push**: the record names the call (`delivery_call`, written first), then the
//!    notification joins the conversation through the session log, and the state
//!    remembers the result's delivery key ([`DELIVERED_EXTENSION`]);
//! 2. **durable**: the harness flushes the session log and saves the state (fenced by the
//!    session lease);
//! 3. **mark**: the harness confirms the call's [`Deliveries`]: `delivered_at` is written
//!    while the lease is still held.
//!
//! A crash between 2 and 3 leaves a record whose key the saved state holds: the next call
//! marks it without pushing it again. A crash between 1 and 2 leaves a record naming a call
//! whose state was never saved: the next call takes that call's notification from the
//! session log into the conversation (without logging it twice), or pushes the result anew
//! when the log never got it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hame_core::{AgentState, Message, Role};
use hame_tools::Workspace;

use crate::task::TaskRecord;

/// The state extension that remembers which results joined this conversation (their
/// [`TaskRecord::delivery_key`]), saved with the messages that carry them.
pub const DELIVERED_EXTENSION: &str = "subagents";
/// Delivery keys remembered in [`DELIVERED_EXTENSION`] (the oldest are forgotten first).
const MAX_REMEMBERED: usize = 1000;

/// Results handed to one call (pushed or returned by a tool), waiting for the call's state
/// to be saved before their records are marked delivered. The harness puts one in each
/// call's [`ParentCall`](crate::ParentCall) and confirms it after the save
/// ([`Subagents::confirm_deliveries`](crate::Subagents::confirm_deliveries)); clones share
/// the list.
#[derive(Debug, Clone, Default)]
pub struct Deliveries(Arc<Mutex<Vec<TaskRecord>>>);

impl Deliveries {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TaskRecord>> {
        // Only whole records are pushed or taken: a poisoned list is still consistent.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a result handed to the call (a second one of the same task replaces it).
    pub(crate) fn add(&self, record: TaskRecord) {
        let mut list = self.lock();
        list.retain(|r| r.task_id != record.task_id);
        list.push(record);
    }

    /// Whether the call took the result of `task_id` already.
    pub(crate) fn contains(&self, task_id: &str) -> bool {
        self.lock().iter().any(|r| r.task_id == task_id)
    }

    /// The delivery keys of the results handed to the call.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.lock().iter().map(TaskRecord::delivery_key).collect()
    }

    /// Takes the results out, for their confirmation.
    pub(crate) fn take(&self) -> Vec<TaskRecord> {
        std::mem::take(&mut *self.lock())
    }

    /// How many results wait for the call's save.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The content of [`DELIVERED_EXTENSION`].
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Delivered {
    /// Delivery keys (`<task id>@<end ms>`); states saved by earlier builds hold bare task
    /// ids, which count for every run of their task.
    #[serde(default)]
    delivered: Vec<String>,
}

impl Delivered {
    /// What `state` remembers.
    pub(crate) fn of(state: &AgentState) -> Self {
        state.extension(DELIVERED_EXTENSION).unwrap_or_default()
    }

    /// Whether `record`'s result joined the conversation already.
    pub(crate) fn has(&self, record: &TaskRecord) -> bool {
        let key = record.delivery_key();
        self.delivered
            .iter()
            .any(|k| *k == key || *k == record.task_id)
    }

    /// Remembers `keys` in `state` (the oldest beyond the bound are dropped).
    pub(crate) fn remember(
        &mut self,
        state: &mut AgentState,
        keys: impl IntoIterator<Item = String>,
    ) {
        let mut changed = false;
        for key in keys {
            if !self.delivered.contains(&key) {
                self.delivered.push(key);
                changed = true;
            }
        }
        if !changed {
            return;
        }
        let excess = self.delivered.len().saturating_sub(MAX_REMEMBERED);
        self.delivered.drain(..excess);
        if let Err(e) = state.set_extension(DELIVERED_EXTENSION, self) {
            tracing::warn!(error = %e, "remembering delivered tasks failed");
        }
    }
}

/// The text by which a notification names a task (see [`crate::notification`]).
pub(crate) fn names_task(text: &str, task_id: &str) -> bool {
    text.contains(&format!("Background task {task_id} "))
}

/// The notifications that calls which stopped before saving their state wrote to the
/// caller's session log for `records` (each names its call in `delivery_call`): each logged
/// message once, with the records it carries, in log order. Records whose notification is
/// not in the log (the call stopped before writing it) are returned apart.
pub(crate) async fn logged_notifications(
    ws: &Workspace,
    agent: &str,
    records: Vec<TaskRecord>,
) -> (Vec<(Message, Vec<TaskRecord>)>, Vec<TaskRecord>) {
    let session = &ws.identity().session;
    let lines = match hame_session::SessionLog::new(ws.records().clone(), agent) {
        Ok(log) => match log.read(session, ..).await {
            Ok(lines) => lines,
            Err(hame_session::Error::SessionNotFound { .. }) => Vec::new(),
            Err(e) => {
                // Unreadable now: push them again rather than lose them.
                tracing::warn!(error = %e, "reading the session log for undelivered results failed");
                return (Vec::new(), records);
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "opening the session log for undelivered results failed");
            return (Vec::new(), records);
        }
    };
    let mut found: BTreeMap<u64, (Message, Vec<TaskRecord>)> = BTreeMap::new();
    let mut missing = Vec::new();
    for record in records {
        let line = lines.iter().find(|l| {
            Some(l.call_id.as_str()) == record.delivery_call.as_deref()
                && l.role == Role::User
                && names_task(&l.message.text_content(), &record.task_id)
        });
        match line {
            Some(l) => found
                .entry(l.seq)
                .or_insert_with(|| (l.message.clone(), Vec::new()))
                .1
                .push(record),
            None => missing.push(record),
        }
    }
    (found.into_values().collect(), missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskStatus;
    use crate::task::tests::record;

    #[test]
    fn a_delivery_is_remembered_per_run_and_old_bare_ids_still_count() {
        let mut state = AgentState::default();
        let mut first = record(TaskStatus::Completed, 0);
        let mut seen = Delivered::of(&state);
        assert!(!seen.has(&first));
        seen.remember(&mut state, [first.delivery_key()]);
        assert!(Delivered::of(&state).has(&first));
        // The same task run again (agent_send) is another delivery.
        first.updated_at += chrono::Duration::seconds(1);
        assert!(!Delivered::of(&state).has(&first));
        // A state saved by an earlier build holds bare task ids.
        let old = record(TaskStatus::Completed, 0);
        let mut legacy = AgentState::default();
        legacy.extensions.insert(
            DELIVERED_EXTENSION.into(),
            serde_json::json!({ "delivered": [old.task_id] }),
        );
        assert!(Delivered::of(&legacy).has(&old));
    }

    #[test]
    fn remembered_keys_are_bounded() {
        let mut state = AgentState::default();
        let mut seen = Delivered::of(&state);
        seen.remember(
            &mut state,
            (0..MAX_REMEMBERED + 10).map(|i| format!("k{i}")),
        );
        let kept = Delivered::of(&state).delivered;
        assert_eq!(kept.len(), MAX_REMEMBERED);
        assert_eq!(kept.first().map(String::as_str), Some("k10"));
    }

    #[test]
    fn a_notification_names_its_tasks() {
        let r = record(TaskStatus::Completed, 0);
        let text = crate::notification(std::slice::from_ref(&r), 100);
        assert!(names_task(&text, &r.task_id));
        assert!(!names_task(&text, "task-000000000000"));
    }
}
