//! A durable run taken over from a worker that died: what that worker logged of the turn
//! but did not save joins the state, so the turn is neither logged twice nor lost.
//!
//! The session log is written before the state is saved ("the log is never behind the
//! state"), so a worker killed between the two leaves records the saved state lacks. The
//! calls of a durable run carry the run id and the claim's attempt in their call id
//! (`<run id>.<attempt>.<uuid>`), and the saved state names the run and the attempt it
//! holds ([`RUNS_EXTENSION`](crate::RUNS_EXTENSION): `{"last": run, "attempt": n}`). A call
//! of a later attempt reads the records of the attempts in between — legs that logged and
//! died before saving — and adopts the longest prefix in which every tool call has its
//! result:
//! - it ends with the turn's final reply: the turn happened; the state gets it and the run
//!   ends with that reply, without a model request (a completion gate around the call
//!   still gives its verdict);
//! - otherwise the turn goes on from there ([`CallInput::Continue`]): the model is asked
//!   the next step, as the dead worker would have done; the tool calls that worker left
//!   running are settled first (`outcome_unknown`, reconciled or run again: the intents
//!   layer), so none of them runs twice.
//!
//! A leg that resumed a waiting run with decisions (ADR 0041) adopts the same way: its
//! first record is the results of the waiting step, which then no longer waits.

use std::collections::BTreeSet;

use hame_core::{AgentState, CallInput, Message, Role, RuntimeContext, Usage};
use hame_session::{SessionLog, SessionLogOptions};
use hame_tools::Workspace;

use crate::agent::{RUN_ATTEMPT_EXTRA, RUN_ID_EXTRA, RUNS_EXTENSION};
use crate::error::{Error, Result};

/// The durable run a call executes and the claim's attempt (1 when the caller gave none).
pub(crate) fn run_attempt(ctx: &RuntimeContext) -> Option<(&str, u64)> {
    let run = ctx.extras.get(RUN_ID_EXTRA)?.as_str()?;
    let attempt = ctx
        .extras
        .get(RUN_ATTEMPT_EXTRA)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(1);
    Some((run, attempt))
}

/// The call id of one attempt of a durable run.
pub(crate) fn call_id(run: &str, attempt: u64) -> String {
    format!("{run}.{attempt}.{}", uuid::Uuid::new_v4())
}

/// What the saved state records of the run: [`RUNS_EXTENSION`]'s value.
pub(crate) fn saved_marker(run: &str, attempt: u64) -> serde_json::Value {
    serde_json::json!({ "last": run, "attempt": attempt })
}

/// The attempt of `run` whose leg the state holds: 0 when it holds none of the run. A
/// state saved before attempts were recorded holds all of its run's legs.
pub(crate) fn saved_attempt(state: &AgentState, run: &str) -> u64 {
    let marker = state.extensions.get(RUNS_EXTENSION);
    if marker.and_then(|v| v.get("last")).and_then(|v| v.as_str()) != Some(run) {
        return 0;
    }
    marker
        .and_then(|v| v.get("attempt"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(u64::MAX)
}

/// What a takeover adopts from the log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Adopted {
    /// The turn's logged messages the state lacks (a complete prefix).
    pub(crate) messages: Vec<Message>,
}

impl Adopted {
    /// Adds the messages to the state and says how the call goes on: the turn continues
    /// from them ([`CallInput::Continue`]; a turn that ends with its final reply is over
    /// at once, without a model request). A state waiting for decisions takes a leg whose
    /// first record answers every waiting call; anything else leaves the state and the
    /// input as they are.
    pub(crate) fn apply(self, state: &mut AgentState, input: CallInput) -> CallInput {
        let (mut steps, mut usage) = (0, Usage::default());
        if let Some(p) = &state.pending {
            let settles = self.messages.first().is_some_and(|m| {
                p.calls
                    .iter()
                    .all(|c| m.tool_results_iter().any(|r| r.id == c.call.id))
            });
            if !settles {
                tracing::warn!(
                    "taken over: the logged leg does not answer the waiting calls; resuming them"
                );
                return input;
            }
            (steps, usage) = (p.iteration, p.usage);
            state.pending = None;
        }
        let mut adopted = Usage::default();
        for m in &self.messages {
            if m.role == Role::Assistant {
                steps += 1;
                if let Some(u) = &m.usage {
                    adopted.add(u);
                }
            }
        }
        usage.add(&adopted);
        state.usage.add(&adopted);
        state.messages.extend(self.messages);
        tracing::info!(
            steps,
            "taken over: the turn's logged messages were adopted from the session log"
        );
        CallInput::Continue { steps, usage }
    }
}

/// How many of a turn's logged messages form a complete prefix: every tool call in it has
/// its result (0: none).
pub(crate) fn complete_prefix(messages: &[Message]) -> usize {
    let mut open = BTreeSet::new();
    let mut keep = 0;
    for (i, m) in messages.iter().enumerate() {
        open.extend(m.tool_calls().map(|c| c.id.as_str()));
        for r in m.tool_results_iter() {
            open.remove(r.id.as_str());
        }
        if open.is_empty() {
            keep = i + 1;
        }
    }
    keep
}

/// The attempt a record of `run` was logged by (`<run>.<attempt>.<uuid>`).
fn attempt_of(call_id: &str, run: &str) -> Option<u64> {
    let rest = call_id.strip_prefix(run)?.strip_prefix('.')?;
    rest.split_once('.')?.0.parse().ok()
}

/// The records that the attempts of `run` strictly between `saved` (the one the state
/// holds) and `current` logged in the session log of `agent`, as what a takeover adopts;
/// `None` when there are none.
pub(crate) async fn logged_turn(
    ws: &Workspace,
    agent: &str,
    session: &str,
    run: &str,
    (saved, current): (u64, u64),
) -> Result<Option<Adopted>> {
    let log = SessionLog::with_options(
        ws.records().clone(),
        agent,
        SessionLogOptions {
            update_index: false,
            ..SessionLogOptions::default()
        },
    )
    .map_err(|e| Error::storage("opening the session log failed", e))?;
    let records = match log.read(session, ..).await {
        Ok(r) => r,
        Err(hame_session::Error::SessionNotFound { .. }) => return Ok(None),
        Err(e) => return Err(Error::storage("reading the session log failed", e)),
    };
    let mut messages: Vec<Message> = records
        .into_iter()
        .filter(|r| attempt_of(&r.call_id, run).is_some_and(|a| saved < a && a < current))
        .map(|r| r.message)
        .collect();
    messages.truncate(complete_prefix(&messages));
    Ok((!messages.is_empty()).then_some(Adopted { messages }))
}

#[cfg(test)]
mod tests {
    use hame_core::{ToolCall, ToolResult};

    use super::*;

    fn calls(ids: &[&str]) -> Message {
        let mut m = Message::assistant("");
        m.content = ids
            .iter()
            .map(|id| {
                hame_core::ContentBlock::ToolCall(ToolCall {
                    id: (*id).into(),
                    name: "t".into(),
                    arguments: "{}".into(),
                })
            })
            .collect();
        m
    }

    fn results(ids: &[&str]) -> Message {
        Message::tool_results(
            ids.iter()
                .map(|id| ToolResult {
                    id: (*id).into(),
                    content: "r".into(),
                    is_error: false,
                    code: None,
                })
                .collect(),
        )
    }

    #[test]
    fn only_steps_whose_calls_all_have_results_are_adopted() {
        let user = Message::user("do");
        let reply = Message::assistant("done");
        assert_eq!(complete_prefix(&[]), 0);
        assert_eq!(complete_prefix(&[user.clone(), reply.clone()]), 2);
        let full = [user.clone(), calls(&["a"]), results(&["a"]), reply.clone()];
        assert_eq!(complete_prefix(&full), 4);
        // Two calls, one result logged: the step is cut; the user message alone is kept.
        let cut = [user.clone(), calls(&["a", "b"]), results(&["a"])];
        assert_eq!(complete_prefix(&cut), 1);
        let later = [
            user,
            calls(&["a"]),
            results(&["a"]),
            calls(&["b", "c"]),
            results(&["c"]),
        ];
        assert_eq!(complete_prefix(&later), 3);
    }

    #[test]
    fn adopted_steps_and_their_usage_continue_the_turn() {
        let mut reply = Message::assistant("done");
        reply.usage = Some(Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        });
        let input = CallInput::Message(Message::user("do"));
        let mut state = AgentState::default();
        let next = Adopted {
            messages: vec![Message::user("do"), calls(&["a"]), results(&["a"]), reply],
        }
        .apply(&mut state, input);
        assert_eq!(
            next,
            CallInput::Continue {
                steps: 2,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 2,
                    ..Usage::default()
                }
            }
        );
        assert_eq!(state.messages.len(), 4);
        assert_eq!(state.usage.total(), 12);
    }

    #[test]
    fn a_decided_leg_answering_every_waiting_call_ends_the_wait()
    -> Result<(), Box<dyn std::error::Error>> {
        let step = hame_core::PendingStep {
            iteration: 2,
            usage: Usage {
                input_tokens: 5,
                output_tokens: 1,
                ..Usage::default()
            },
            calls: ["a", "b"]
                .iter()
                .map(|id| hame_core::PendingCall {
                    call: ToolCall {
                        id: (*id).into(),
                        name: "t".into(),
                        arguments: "{}".into(),
                    },
                    result: None,
                    suspension: None,
                })
                .collect(),
        };
        let waiting = AgentState {
            pending: Some(step),
            ..AgentState::default()
        };
        let resume = CallInput::Resume(Vec::new());
        // Only one of the two waiting calls answered: nothing is adopted.
        let mut state = waiting.clone();
        let next = Adopted {
            messages: vec![results(&["a"])],
        }
        .apply(&mut state, resume.clone());
        assert_eq!(next, resume);
        assert_eq!(state, waiting);
        // Both answered, then the reply: the turn goes on (and ends) after the waiting
        // step, with the turn's usage so far.
        let mut state = waiting;
        let next = Adopted {
            messages: vec![results(&["a", "b"]), Message::assistant("done")],
        }
        .apply(&mut state, resume);
        let CallInput::Continue { steps, usage } = next else {
            return Err(format!("not continued: {next:?}").into());
        };
        assert_eq!((steps, usage.total()), (3, 6));
        assert!(state.pending.is_none());
        assert_eq!(state.messages.len(), 2);
        Ok(())
    }

    #[test]
    fn records_are_told_apart_by_run_and_attempt() {
        let id = call_id("run-1", 3);
        assert_eq!(attempt_of(&id, "run-1"), Some(3));
        assert_eq!(attempt_of(&id, "run-12"), None);
        assert_eq!(attempt_of(&id, "run"), None);
        // Records of a run logged before attempts were in call ids: no attempt.
        assert_eq!(attempt_of("run-1.5c5c8cb4-f5c3-4b7e", "run-1"), None);
        assert_eq!(attempt_of("run-1.x.y", "run-1"), None);

        let mut state = AgentState::default();
        assert_eq!(saved_attempt(&state, "run-1"), 0);
        state
            .extensions
            .insert(RUNS_EXTENSION.to_owned(), saved_marker("run-1", 2));
        assert_eq!(saved_attempt(&state, "run-1"), 2);
        assert_eq!(saved_attempt(&state, "run-2"), 0);
        // A state saved before attempts were recorded holds all of its run.
        state.extensions.insert(
            RUNS_EXTENSION.to_owned(),
            serde_json::json!({ "last": "run-1" }),
        );
        assert_eq!(saved_attempt(&state, "run-1"), u64::MAX);
    }
}
