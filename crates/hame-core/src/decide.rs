//! The loop's decisions as plain functions over plain data (no I/O, no async), so the hard
//! cases — what to run, when to stop, how a suspended step settles, how a failed turn is
//! closed — are unit- and property-tested without a model or a runtime.

use crate::layer::{Resumed, ToolOutcome};
use crate::message::{Message, Role, ToolCall, ToolResult, Usage};
use crate::suspend::{PendingCall, PendingStep, Resolution, suspension_id};
use crate::tool::{ToolError, codes, to_tool_result};

/// Why the loop stops before a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The call was cancelled.
    Cancelled,
    /// The step limit was reached.
    MaxIterations,
}

/// Whether step `iteration` (1-based) may start.
pub fn before_step(iteration: usize, max_iterations: usize, cancelled: bool) -> Option<Stop> {
    if cancelled {
        Some(Stop::Cancelled)
    } else if iteration > max_iterations {
        Some(Stop::MaxIterations)
    } else {
        None
    }
}

/// What a model response asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterResponse {
    /// A final answer: the call ends.
    Finish,
    /// Tool calls to run, in order.
    RunTools(Vec<ToolCall>),
}

/// What the loop does with a response message.
pub fn after_response(message: &Message) -> AfterResponse {
    let calls: Vec<ToolCall> = message.tool_calls().cloned().collect();
    if calls.is_empty() {
        AfterResponse::Finish
    } else {
        AfterResponse::RunTools(calls)
    }
}

/// How a step's tool calls settled.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// Every call has a result, in call order.
    Results(Vec<ToolResult>),
    /// Some calls wait for decisions; the step is kept whole.
    Pending(PendingStep),
}

/// Settles a step: its calls and their outcomes, in order. `position` is the length of the
/// conversation (it makes suspension ids unique within the session).
pub fn settle(
    calls: Vec<ToolCall>,
    outcomes: Vec<ToolOutcome>,
    position: usize,
    iteration: usize,
    usage: Usage,
) -> Settled {
    let pending: Vec<PendingCall> = calls
        .into_iter()
        .zip(outcomes)
        .map(|(call, outcome)| match outcome {
            ToolOutcome::Done(out) => PendingCall {
                result: Some(to_tool_result(&call.id, out)),
                call,
                suspension: None,
            },
            ToolOutcome::Suspend(mut s) => {
                s.id = suspension_id(position, &call);
                PendingCall {
                    call,
                    result: None,
                    suspension: Some(s),
                }
            }
        })
        .collect();
    close(PendingStep {
        iteration,
        usage,
        calls: pending,
    })
}

fn close(step: PendingStep) -> Settled {
    if step.calls.iter().any(|c| c.result.is_none()) {
        return Settled::Pending(step);
    }
    Settled::Results(step.calls.into_iter().filter_map(|c| c.result).collect())
}

/// A resolution that names no waiting call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no pending call has id {id:?} (pending: {pending})")]
pub struct UnknownResolution {
    /// The id given.
    pub id: String,
    /// The ids that are pending, comma-separated.
    pub pending: String,
}

/// Which waiting calls the resolutions decide: `(index in the step, what resumes it)`.
/// Calls without a resolution keep waiting.
pub fn match_resolutions(
    step: &PendingStep,
    resolutions: &[Resolution],
) -> Result<Vec<(usize, Resumed)>, UnknownResolution> {
    let mut out = Vec::new();
    for r in resolutions {
        let found = step.calls.iter().enumerate().find(|(_, c)| {
            c.result.is_none() && c.suspension.as_ref().is_some_and(|s| s.id == r.id)
        });
        match found {
            Some((i, c)) => {
                if let Some(s) = &c.suspension
                    && !out.iter().any(|(j, _)| *j == i)
                {
                    out.push((
                        i,
                        Resumed {
                            suspension: s.clone(),
                            resolution: r.clone(),
                        },
                    ));
                }
            }
            None => {
                return Err(UnknownResolution {
                    id: r.id.clone(),
                    pending: step
                        .waiting()
                        .map(|(_, s)| s.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
    }
    Ok(out)
}

/// Puts the outcomes of resumed calls into the step. A call suspended again keeps its id.
pub fn apply_resume(mut step: PendingStep, outcomes: Vec<(usize, ToolOutcome)>) -> Settled {
    for (i, outcome) in outcomes {
        let Some(slot) = step.calls.get_mut(i) else {
            continue;
        };
        match outcome {
            ToolOutcome::Done(out) => {
                slot.result = Some(to_tool_result(&slot.call.id, out));
                slot.suspension = None;
            }
            ToolOutcome::Suspend(mut s) => {
                if let Some(old) = &slot.suspension {
                    s.id = old.id.clone();
                }
                slot.suspension = Some(s);
            }
        }
    }
    close(step)
}

/// The messages that close a turn that failed with `failure`, so the conversation stays
/// valid for the next call: an error result for every tool call still without one (a
/// provider rejects an unpaired call), then an assistant note saying the request failed
/// (so the next request does not replay a pile of unanswered turns as if they were new).
/// Nothing when the conversation already ends with an assistant's final answer.
pub fn close_failed_turn(messages: &[Message], failure: &str) -> Vec<Message> {
    let Some(last) = messages.last() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if last.role == Role::Assistant && !last.has_tool_calls() {
        return out;
    }
    if last.role == Role::Assistant {
        let results: Vec<ToolResult> = last
            .tool_calls()
            .map(|c| {
                to_tool_result(
                    &c.id,
                    Err(ToolError::new(
                        codes::CANCELLED,
                        "the call failed before this tool finished",
                    )),
                )
            })
            .collect();
        out.push(Message::tool_results(results));
    }
    let note: String = failure.chars().take(500).collect();
    out.push(Message::assistant(format!(
        "[This request did not finish: {note}]"
    )));
    out
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
