use super::*;
use crate::suspend::Suspension;
use crate::tool::ToolError;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "t".into(),
        arguments: "{}".into(),
    }
}

fn assistant_with_calls(ids: &[&str]) -> Message {
    let mut m = Message::assistant("");
    m.content = ids
        .iter()
        .map(|id| crate::ContentBlock::ToolCall(call(id)))
        .collect();
    m
}

/// Every tool call in `messages` has exactly one result after it.
fn paired(messages: &[Message]) -> bool {
    let calls: Vec<String> = messages
        .iter()
        .flat_map(|m| m.tool_calls().map(|c| c.id.clone()))
        .collect();
    let results: Vec<String> = messages
        .iter()
        .flat_map(|m| m.tool_results_iter().map(|r| r.id.clone()))
        .collect();
    calls == results
}

#[test]
fn steps_stop_on_cancel_first_then_on_the_limit() {
    assert_eq!(before_step(1, 50, false), None);
    assert_eq!(before_step(50, 50, false), None);
    assert_eq!(before_step(51, 50, false), Some(Stop::MaxIterations));
    assert_eq!(before_step(51, 50, true), Some(Stop::Cancelled));
    assert_eq!(before_step(1, 0, false), Some(Stop::MaxIterations));
}

#[test]
fn a_response_without_calls_finishes() {
    assert_eq!(
        after_response(&Message::assistant("hi")),
        AfterResponse::Finish
    );
    assert_eq!(
        after_response(&assistant_with_calls(&["a", "b"])),
        AfterResponse::RunTools(vec![call("a"), call("b")])
    );
}

#[test]
fn a_failed_turn_is_closed_with_results_and_a_note() {
    // Failed during tools: the calls get results, then the note.
    let msgs = vec![Message::user("go"), assistant_with_calls(&["1", "2"])];
    let add = close_failed_turn(&msgs, "boom");
    assert_eq!(add.len(), 2);
    assert_eq!(
        add[0]
            .tool_results_iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        vec!["1", "2"]
    );
    assert!(add[1].text_content().contains("boom"));
    // Failed on the first request: only the note.
    assert_eq!(close_failed_turn(&[Message::user("go")], "down").len(), 1);
    // Failed after the final answer (a layer failed late): nothing to add.
    let done = vec![Message::user("go"), Message::assistant("done")];
    assert!(close_failed_turn(&done, "late").is_empty());
    assert!(close_failed_turn(&[], "x").is_empty());
}

#[test]
fn settle_keeps_finished_results_and_names_waiting_calls() {
    let calls = vec![call("1"), call("2")];
    let outcomes = vec![
        ToolOutcome::Done(Ok("ok".into())),
        ToolOutcome::Suspend(Suspension::new("perm", "ask")),
    ];
    let Settled::Pending(step) = settle(calls, outcomes, 7, 3, Usage::default()) else {
        panic!("expected pending");
    };
    assert_eq!(step.iteration, 3);
    assert!(step.calls[0].result.is_some());
    let id = step.calls[1].suspension.as_ref().map(|s| s.id.clone());
    assert!(id.as_deref().is_some_and(|i| i.starts_with("ap-")));
    // Same place, same call: same id (a re-run shows the same approval id).
    let again = settle(
        vec![call("1"), call("2")],
        vec![
            ToolOutcome::Done(Ok("ok".into())),
            ToolOutcome::Suspend(Suspension::new("perm", "ask")),
        ],
        7,
        3,
        Usage::default(),
    );
    let Settled::Pending(again) = again else {
        panic!("expected pending");
    };
    assert_eq!(again.calls[1].suspension.as_ref().map(|s| s.id.clone()), id);
}

#[test]
fn resolutions_match_only_waiting_calls() {
    let Settled::Pending(step) = settle(
        vec![call("1"), call("2")],
        vec![
            ToolOutcome::Suspend(Suspension::new("perm", "ask")),
            ToolOutcome::Suspend(Suspension::new("perm", "ask")),
        ],
        0,
        1,
        Usage::default(),
    ) else {
        panic!("expected pending");
    };
    let ids: Vec<String> = step.waiting().map(|(_, s)| s.id.clone()).collect();
    assert_ne!(ids[0], ids[1]);
    let m = match_resolutions(&step, &[Resolution::new(&ids[1], serde_json::json!(1))]);
    assert_eq!(
        m.map(|v| v.iter().map(|(i, _)| *i).collect::<Vec<_>>()),
        Ok(vec![1])
    );
    let e = match_resolutions(&step, &[Resolution::new("ap-x", serde_json::json!(1))]);
    assert!(e.is_err_and(|e| e.pending.contains(&ids[0])));
    // Deciding one of two keeps the step pending; deciding both closes it.
    let one = apply_resume(step.clone(), vec![(1, ToolOutcome::Done(Ok("b".into())))]);
    assert!(matches!(one, Settled::Pending(_)));
    let both = apply_resume(
        step,
        vec![
            (1, ToolOutcome::Done(Ok("b".into()))),
            (0, ToolOutcome::Done(Err(ToolError::new("x", "y")))),
        ],
    );
    let Settled::Results(r) = both else {
        panic!("expected results");
    };
    assert_eq!(
        r.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        vec!["1", "2"]
    );
}

proptest! {
    /// Whatever the outcomes and the order of decisions, a step ends with one result per
    /// call, in the model's order; until then it stays pending.
    #[test]
    fn steps_settle_to_one_result_per_call_in_order(
        suspended in proptest::collection::vec(any::<bool>(), 1..8),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let calls: Vec<ToolCall> = (0..suspended.len()).map(|i| call(&i.to_string())).collect();
        let outcomes = suspended
            .iter()
            .map(|s| if *s {
                ToolOutcome::Suspend(Suspension::new("l", "r"))
            } else {
                ToolOutcome::Done(Ok("x".into()))
            })
            .collect();
        let mut settled = settle(calls.clone(), outcomes, 0, 1, Usage::default());
        for idx in order {
            let Settled::Pending(step) = settled.clone() else { break };
            let waiting: Vec<String> = step.waiting().map(|(_, s)| s.id.clone()).collect();
            let pick = &waiting[idx.index(waiting.len())];
            let matched = match_resolutions(&step, &[Resolution::new(pick, serde_json::json!(true))]);
            prop_assert!(matched.is_ok());
            let outs = matched.unwrap_or_default().into_iter().map(|(i, _)| (i, ToolOutcome::Done(Ok("y".into())))).collect();
            settled = apply_resume(step, outs);
        }
        match settled {
            Settled::Results(r) => {
                let ids: Vec<String> = r.iter().map(|r| r.id.clone()).collect();
                let want: Vec<String> = calls.iter().map(|c| c.id.clone()).collect();
                prop_assert_eq!(ids, want);
            }
            Settled::Pending(step) => {
                prop_assert!(step.waiting().count() > 0);
                prop_assert_eq!(step.calls.len(), calls.len());
            }
        }
    }

    /// Closing a failed turn always leaves every tool call paired with a result and the
    /// conversation ending with an assistant message.
    #[test]
    fn closing_a_failed_turn_pairs_every_call(
        shape in proptest::collection::vec(0u8..3, 0..6),
        failure in "\\PC{0,40}",
    ) {
        let mut msgs = vec![Message::user("start")];
        for (i, s) in shape.iter().enumerate() {
            match s {
                0 => msgs.push(Message::user(format!("u{i}"))),
                1 => {
                    let id = format!("c{i}");
                    msgs.push(assistant_with_calls(&[&id]));
                    msgs.push(Message::tool_results(vec![to_tool_result(&id, Ok("r".into()))]));
                }
                _ => msgs.push(Message::assistant(format!("a{i}"))),
            }
        }
        // The failure may strike right after a tool-call message.
        if shape.last() == Some(&1) {
            msgs.pop();
        }
        let mut all = msgs.clone();
        all.extend(close_failed_turn(&msgs, &failure));
        prop_assert!(paired(&all));
        prop_assert_eq!(all.last().map(|m| m.role), Some(Role::Assistant));
    }
}
