//! A durable run taken over from a worker that died: what that worker logged of the turn
//! but did not save joins the state, so the turn is neither logged twice nor lost.
//!
//! The session log is written before the state is saved ("the log is never behind the
//! state"), so a worker killed between the two leaves records the saved state lacks. The
//! calls of a durable run carry the run id in their call id (`<run id>.<uuid>`); the call
//! that takes the run over reads the run's records and adopts the longest prefix in which
//! every tool call has its result:
//! - it ends with the turn's final reply: the turn happened; the state gets it and the run
//!   ends with that reply, without a model request;
//! - otherwise the turn goes on from there ([`CallInput::Continue`]): the model is asked
//!   the next step, as the dead worker would have done.
//!
//! A step cut in the middle of its tool calls (some results logged, not all) is not
//! adopted: the turn goes on from the step before it, and the cut calls' intents are
//! settled (reconciled, or reported `outcome_unknown`) at the session's next message, as
//! before.

use std::collections::BTreeSet;

use hame_core::{AgentState, CallInput, CallOutput, Message, Role, Usage};
use hame_session::{SessionLog, SessionLogOptions};
use hame_tools::Workspace;

use crate::error::{Error, Result};

/// What a takeover adopts from the log.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Adopted {
    /// The turn's logged messages the state lacks (a complete prefix).
    pub(crate) messages: Vec<Message>,
}

impl Adopted {
    /// Adds the messages to the state and says how the call goes on: the input to run
    /// (the original one is already in the log) or, for a finished turn, its output.
    pub(crate) fn apply(
        self,
        state: &mut AgentState,
        input: CallInput,
    ) -> (CallInput, Option<CallOutput>) {
        let mut usage = Usage::default();
        let mut steps = 0;
        for m in &self.messages {
            if m.role == Role::Assistant {
                steps += 1;
                if let Some(u) = &m.usage {
                    usage.add(u);
                }
            }
        }
        state.usage.add(&usage);
        let last = self.messages.last().cloned();
        state.messages.extend(self.messages);
        tracing::info!(
            steps,
            "taken over: the turn's logged messages were adopted from the session log"
        );
        match last {
            Some(reply) if reply.role == Role::Assistant && !reply.has_tool_calls() => (
                input,
                Some(CallOutput {
                    reply,
                    usage,
                    iterations: steps,
                    verification: None,
                }),
            ),
            Some(_) => (CallInput::Continue { steps, usage }, None),
            None => (input, None),
        }
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

/// The run's records in the session log of `agent` (its calls' ids start with `<run>.`),
/// as what a takeover adopts; `None` when nothing of the turn was logged.
pub(crate) async fn logged_turn(
    ws: &Workspace,
    agent: &str,
    session: &str,
    run: &str,
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
    let prefix = format!("{run}.");
    let mut messages: Vec<Message> = records
        .into_iter()
        .filter(|r| r.call_id.starts_with(&prefix))
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
    fn a_logged_reply_ends_the_turn_and_a_logged_step_continues_it() {
        let mut reply = Message::assistant("done");
        reply.usage = Some(Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        });
        let input = CallInput::Message(Message::user("do"));
        let mut state = AgentState::default();
        let (_, out) = Adopted {
            messages: vec![Message::user("do"), reply.clone()],
        }
        .apply(&mut state, input.clone());
        let out = out.map(|o| (o.reply.text_content(), o.iterations, o.usage.total()));
        assert_eq!(out, Some(("done".to_owned(), 1, 12)));
        assert_eq!(state.messages.len(), 2);
        assert_eq!(state.usage.total(), 12);

        let mut state = AgentState::default();
        let (next, out) = Adopted {
            messages: vec![Message::user("do"), calls(&["a"]), results(&["a"])],
        }
        .apply(&mut state, input);
        assert!(out.is_none());
        assert_eq!(
            next,
            CallInput::Continue {
                steps: 1,
                usage: Usage::default()
            }
        );
        assert_eq!(state.messages.len(), 3);
    }
}
