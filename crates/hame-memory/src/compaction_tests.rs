#![allow(clippy::unwrap_used)]

use super::*;
use crate::tokens::EstimateCounter;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{AgentLoop, EventSink, ModelError, RuntimeContext, ToolCall, ToolResult};
use pretty_assertions::assert_eq;
use proptest::prelude::*;

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "read_file".into(),
        arguments: format!("{{\"path\":\"{id}.txt\"}}"),
    }
}

fn assistant_calls(ids: &[&str]) -> Message {
    Message {
        role: Role::Assistant,
        content: ids
            .iter()
            .map(|id| ContentBlock::ToolCall(call(id)))
            .collect(),
        usage: None,
    }
}

fn results(ids: &[&str]) -> Message {
    Message::tool_results(
        ids.iter()
            .map(|id| ToolResult {
                id: (*id).into(),
                content: format!("contents of {id}"),
                is_error: false,
                code: None,
            })
            .collect(),
    )
}

fn counter() -> EstimateCounter {
    EstimateCounter
}

fn policy(keep: usize) -> CompactionPolicy {
    CompactionPolicy {
        max_messages: 4,
        keep_recent_messages: keep,
        ..CompactionPolicy::default()
    }
}

#[test]
fn no_plan_below_the_trigger() {
    let msgs = vec![Message::user("a"), Message::assistant("b")];
    assert_eq!(plan_compaction(&msgs, &policy(1), &counter()), None);
    let p = CompactionPolicy {
        trigger_tokens: Some(1),
        ..policy(1)
    };
    assert!(
        plan_compaction(&msgs, &p, &counter()).is_none(),
        "only one message to summarise"
    );
}

#[test]
fn cut_moves_back_to_keep_a_call_with_its_result() {
    let msgs = vec![
        Message::user("first"),
        Message::assistant("ok"),
        Message::user("read a"),
        assistant_calls(&["a"]),
        results(&["a"]),
        Message::assistant("done"),
    ];
    // keep 2 would cut between the call (3) and its result (4): the cut moves to 3.
    let plan = plan_forced(&msgs, &policy(2), &counter()).unwrap();
    assert_eq!(plan.range, 0..3);
    assert_eq!(plan.keep_request, Some(2));
    let out = apply(&msgs, &plan, "S", SeqSpan { from: 0, to: 2 }).unwrap();
    assert_eq!(out.len(), 5);
    assert_eq!(summary_span(&out[0]), Some(SeqSpan { from: 0, to: 2 }));
    assert_eq!(out[1], msgs[2]);
    assert_eq!(&out[2..], &msgs[3..]);
}

#[test]
fn in_flight_calls_are_never_compacted() {
    let msgs = vec![
        Message::user("one"),
        Message::assistant("two"),
        Message::user("three"),
        assistant_calls(&["x"]),
        Message::assistant("four"),
        Message::assistant("five"),
    ];
    let plan = plan_forced(&msgs, &policy(0), &counter()).unwrap();
    assert_eq!(plan.range, 0..3);
}

#[test]
fn system_messages_are_kept_verbatim() {
    let msgs = vec![
        Message::system("rules"),
        Message::user("u1"),
        Message::assistant("a1"),
        Message::system("more rules"),
        Message::user("u2"),
        Message::assistant("a2"),
    ];
    let plan = plan_forced(&msgs, &policy(1), &counter()).unwrap();
    assert_eq!(plan.range, 0..5);
    assert_eq!(plan.keep_system, vec![0, 3]);
    let out = apply(&msgs, &plan, "sum", SeqSpan { from: 0, to: 4 }).unwrap();
    assert_eq!(
        out.iter().map(|m| m.role).collect::<Vec<_>>(),
        vec![
            Role::System,
            Role::System,
            Role::User,
            Role::User,
            Role::Assistant
        ]
    );
    assert_eq!(out[3], msgs[4]);
}

#[test]
fn keep_tokens_bounds_the_tail() {
    let big = "word ".repeat(400);
    let msgs: Vec<Message> = (0..10)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!("{i} {big}"))
            } else {
                Message::assistant(format!("{i} {big}"))
            }
        })
        .collect();
    let p = CompactionPolicy {
        keep_recent_tokens: Some(500),
        ..policy(8)
    };
    let plan = plan_forced(&msgs, &p, &counter()).unwrap();
    assert_eq!(
        plan.range,
        0..9,
        "each message is ~400 tokens: only the last fits"
    );
    assert_eq!(plan.keep_request, Some(8));
}

#[test]
fn summary_marker_round_trip() {
    let m = summary_message(SeqSpan { from: 3, to: 17 }, "  text ");
    assert_eq!(summary_span(&m), Some(SeqSpan { from: 3, to: 17 }));
    assert!(
        m.text_content()
            .starts_with("[summary of messages #3..#17]\n")
    );
    assert!(m.text_content().ends_with("\n\ntext"));
    assert_eq!(
        summary_span(&Message::user("[summary of messages #x..#2]")),
        None
    );
    assert_eq!(
        summary_span(&Message::assistant("[summary of messages #1..#2]")),
        None
    );
}

#[test]
fn policy_resolves_from_the_window() {
    let p = CompactionPolicy::default().resolved_for_window(128_000);
    assert_eq!(p.trigger_tokens, Some(108_000));
    assert_eq!(p.keep_recent_tokens, Some(8_000));
    let small = CompactionPolicy::default().resolved_for_window(30_000);
    assert_eq!(small.trigger_tokens, Some(24_000));
    let bench = CompactionPolicy::default().resolved_for_window(64_000);
    assert_eq!(bench.trigger_tokens, Some(51_200));
    assert_eq!(small.keep_recent_tokens, Some(2_500));
}

fn long_conversation(turns: usize) -> Vec<Message> {
    let mut msgs = Vec::new();
    for t in 0..turns {
        msgs.push(Message::user(format!("request {t}")));
        let id = format!("c{t}");
        msgs.push(assistant_calls(&[id.as_str()]));
        msgs.push(results(&[id.as_str()]));
        msgs.push(Message::assistant(format!("answer {t}")));
    }
    msgs
}

fn model(replies: Vec<Reply>) -> (ScriptedModel, Arc<dyn Model>) {
    let m = ScriptedModel::new(replies);
    (m.clone(), Arc::new(m))
}

fn compactor(config: CompactorConfig) -> Compactor {
    Compactor::new(config, Arc::new(EstimateCounter))
}

/// The summariser's transcript names an image; its base64 never reaches the prompt.
#[test]
fn the_transcript_names_an_image_and_leaves_its_bytes_out() {
    let image = crate::test_support::big_image();
    let m = Message::user_with_images("my cat", vec![image.clone()]);
    let c = compactor(CompactorConfig::default());
    let t = c.transcript(&[m], &CompactionState::default());
    assert_eq!(t, vec![format!("#0 user: my cat\n{}", image.describe())]);
}

#[tokio::test]
async fn compact_replaces_history_and_records_sequence_numbers() -> Result<()> {
    let (scripted, m) = model(vec![Reply::text("## Intent\nfirst summary")]);
    let c = compactor(CompactorConfig {
        policy: policy(4),
        ..CompactorConfig::default()
    });
    let mut state = AgentState {
        messages: long_conversation(5),
        ..AgentState::default()
    };
    let report = c.compact(&mut state, &m).await?.unwrap();
    assert_eq!((report.from_seq, report.to_seq), (0, 15));
    assert_eq!(state.messages.len(), 5);
    assert_eq!(
        summary_span(&state.messages[0]),
        Some(SeqSpan { from: 0, to: 15 })
    );
    assert!(state.messages[0].text_content().ends_with("first summary"));
    let cs = CompactionState::load(&state);
    assert_eq!(cs.head, vec![SeqSpan { from: 0, to: 15 }]);
    assert_eq!(cs.tail_seq, 16);
    assert_eq!(cs.history.len(), 1);
    // The summariser saw the transcript with sequence numbers and no system prompt leak.
    let req = &scripted.requests()[0];
    assert_eq!(req.system, SUMMARY_SYSTEM_PROMPT);
    assert!(req.tools.is_empty());
    let text = req.messages[0].text_content();
    assert!(text.contains("#0 user: request 0"));
    assert!(text.contains("[call c0 read_file({\"path\":\"c0.txt\"})]"));
    assert!(text.contains("#15 assistant: answer 3"));
    assert!(!text.contains("request 4"));

    // Second, chained compaction: the earlier summary is summarised again.
    state.messages.extend(long_conversation(2));
    scripted.push(Reply::text("second summary"));
    let report = c.compact(&mut state, &m).await?.unwrap();
    // 13 messages (#0..#15 summary, #16..#27), keep 4: #0..#23 are replaced.
    assert_eq!((report.from_seq, report.to_seq), (0, 23));
    assert_eq!(
        summary_span(&state.messages[0]),
        Some(SeqSpan { from: 0, to: 23 })
    );
    let text = scripted.requests()[1].messages[0].text_content();
    assert!(text.contains("#0..#15 earlier summary:"));
    assert!(text.contains("#16 user: request 4"));
    let cs = CompactionState::load(&state);
    assert_eq!(cs.tail_seq, 24);
    assert_eq!(cs.next_seq(state.messages.len()), 28);
    assert_eq!(cs.history.len(), 2);
    Ok(())
}

#[tokio::test]
async fn failed_or_empty_summary_leaves_state_unchanged() -> Result<()> {
    let c = compactor(CompactorConfig {
        policy: policy(2),
        ..CompactorConfig::default()
    });
    let original = AgentState {
        messages: long_conversation(3),
        ..AgentState::default()
    };
    for reply in [
        Reply::Fail(ModelError::Transport {
            message: "reset".into(),
            source: None,
        }),
        Reply::text("   \n "),
        Reply::tools(&[call("zz")]),
        Reply::Events(vec![
            hame_core::ModelEvent::TextDelta("partial".into()),
            hame_core::ModelEvent::Stop(StopReason::MaxTokens),
        ]),
    ] {
        let (_, m) = model(vec![reply]);
        let mut state = original.clone();
        let err = c.compact(&mut state, &m).await;
        assert!(
            matches!(err, Err(Error::Model { .. } | Error::UnusableOutput { .. })),
            "{err:?}"
        );
        assert_eq!(state, original);
    }
    Ok(())
}

#[tokio::test]
async fn oversized_input_is_summarised_in_chunks_and_merged() -> Result<()> {
    let replies: Vec<Reply> = (0..40).map(|i| Reply::text(&format!("part {i}"))).collect();
    let (scripted, m) = model(replies);
    let c = compactor(CompactorConfig {
        policy: policy(1),
        summary_input_tokens: Some(6_000),
        summary_max_tokens: 1_000,
        ..CompactorConfig::default()
    });
    let big = "lorem ipsum dolor sit amet ".repeat(300);
    let mut state = AgentState::default();
    for i in 0..8 {
        state.messages.push(Message::user(format!("{i} {big}")));
        state
            .messages
            .push(Message::assistant(format!("{i} {big}")));
    }
    let report = c.compact(&mut state, &m).await?.unwrap();
    assert!(report.model_calls > 2, "{report:?}");
    let reqs = scripted.requests();
    assert_eq!(reqs.len() as u32, report.model_calls);
    assert!(
        reqs[0].messages[0]
            .text_content()
            .contains("This is part 1 of")
    );
    let last = reqs.last().unwrap().messages[0].text_content();
    assert!(last.starts_with(MERGE_PROMPT));
    assert!(last.contains("### Part 1\npart 0"));
    let last_reply = format!("part {}", report.model_calls - 1);
    assert!(state.messages[0].text_content().ends_with(&last_reply));
    for r in &reqs {
        let t = EstimateCounter.count(&r.messages[0].text_content());
        assert!(t <= 6_000, "request of {t} tokens exceeds the budget");
    }
    Ok(())
}

#[tokio::test]
async fn the_layer_compacts_on_overflow_and_retries() -> Result<()> {
    let (scripted, m) = model(vec![
        Reply::Fail(ModelError::ContextOverflow {
            message: "too long".into(),
        }),
        Reply::text("the summary"),
        Reply::text("final answer"),
    ]);
    let c = Arc::new(compactor(CompactorConfig {
        policy: CompactionPolicy {
            max_messages: 1_000,
            keep_recent_messages: 2,
            ..CompactionPolicy::default()
        },
        ..CompactorConfig::default()
    }));
    let agent = AgentLoop::new(Arc::clone(&m))
        .with_layer(Arc::new(CompactionLayer::new(c, Arc::clone(&m))));
    let mut state = AgentState {
        messages: long_conversation(3),
        ..AgentState::default()
    };
    let (events, mut rx) = EventSink::channel();
    let out = agent
        .run(
            &mut state,
            Message::user("go on"),
            &RuntimeContext::new("s"),
            &events,
            &Default::default(),
        )
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    assert_eq!(out.reply.text_content(), "final answer");
    let mut saw = None;
    while let Ok(ev) = rx.try_recv() {
        if let AgentEvent::Compaction {
            from_seq,
            to_seq,
            before_tokens,
            after_tokens,
        } = ev
        {
            saw = Some((from_seq, to_seq));
            assert!(after_tokens < before_tokens);
        }
    }
    // 13 messages, keep 2: #0..#10 are replaced.
    assert_eq!(saw, Some((0, 10)));
    // The retried request carried the summary and the kept tail with the latest request.
    let retried = &scripted.requests()[2];
    assert!(is_summary(&retried.messages[0]));
    assert_eq!(retried.messages[1], Message::assistant("answer 2"));
    assert_eq!(retried.messages[2], Message::user("go on"));
    Ok(())
}

/// One call of `agent` with the user message "next".
async fn run_next(agent: &AgentLoop, state: &mut AgentState) -> Result<()> {
    agent
        .run(
            state,
            Message::user("next"),
            &RuntimeContext::new("s"),
            &EventSink::none(),
            &Default::default(),
        )
        .await
        .map(|_| ())
        .map_err(|e| Error::InvalidInput(e.to_string()))
}

#[tokio::test]
async fn the_layer_compacts_by_count_before_the_request() -> Result<()> {
    let (reqs, state) = compact_next(None, "sum").await?;
    assert_eq!(reqs.len(), 2);
    assert!(is_summary(&reqs[1].messages[0]));
    assert_eq!(reqs[1].messages.len(), 5);
    // summary + kept tail (4: incl. the new request) + the answer
    assert_eq!(state.messages.len(), 6);
    Ok(())
}

#[tokio::test]
async fn the_layer_survives_a_failed_summary() -> Result<()> {
    let (_, m) = model(vec![
        Reply::Fail(ModelError::Provider {
            status: 500,
            body: "x".into(),
        }),
        Reply::text("answer"),
    ]);
    let c = Arc::new(compactor(CompactorConfig {
        policy: CompactionPolicy {
            max_messages: 2,
            keep_recent_messages: 1,
            ..CompactionPolicy::default()
        },
        ..CompactorConfig::default()
    }));
    let agent = AgentLoop::new(Arc::clone(&m))
        .with_layer(Arc::new(CompactionLayer::new(c, Arc::clone(&m))));
    let original = long_conversation(2);
    let mut state = AgentState {
        messages: original.clone(),
        ..AgentState::default()
    };
    let (events, mut rx) = EventSink::channel();
    agent
        .run(
            &mut state,
            Message::user("q"),
            &RuntimeContext::new("s"),
            &events,
            &Default::default(),
        )
        .await
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
    assert_eq!(&state.messages[..original.len()], &original[..]);
    let mut failed = false;
    while let Ok(ev) = rx.try_recv() {
        if matches!(&ev, AgentEvent::Custom { kind, .. } if kind == "compaction.failed") {
            failed = true;
        }
    }
    assert!(failed);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Property tests over generated conversations.

#[derive(Debug, Clone)]
enum Step {
    System,
    User,
    Assistant,
    /// Tool calls (count) with results in order, optionally split over two messages.
    Tools(usize, bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => Just(Step::System),
        4 => Just(Step::User),
        3 => Just(Step::Assistant),
        4 => (1usize..4, any::<bool>()).prop_map(|(n, split)| Step::Tools(n, split)),
    ]
}

/// Builds a conversation; `in_flight` leaves the last tool calls without results; a
/// leading summary stands for an earlier compaction of `prior` messages.
fn build(steps: &[Step], in_flight: bool, prior: Option<u64>) -> (Vec<Message>, CompactionState) {
    let mut msgs = Vec::new();
    let mut seqs = CompactionState::default();
    if let Some(k) = prior {
        msgs.push(summary_message(SeqSpan { from: 0, to: k }, "earlier"));
        seqs.head = vec![SeqSpan { from: 0, to: k }];
        seqs.tail_seq = k + 1;
    }
    let mut next_id = 0;
    for (i, s) in steps.iter().enumerate() {
        match s {
            Step::System => msgs.push(Message::system(format!("sys {i}"))),
            Step::User => msgs.push(Message::user(format!("user {i} {}", "x ".repeat(i % 7)))),
            Step::Assistant => msgs.push(Message::assistant(format!("assistant {i}"))),
            Step::Tools(n, split) => {
                let ids: Vec<String> = (0..*n)
                    .map(|_| {
                        next_id += 1;
                        format!("id{next_id}")
                    })
                    .collect();
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                msgs.push(assistant_calls(&refs));
                let last = i == steps.len() - 1;
                if last && in_flight {
                    continue;
                }
                if *split && refs.len() > 1 {
                    msgs.push(results(&refs[..1]));
                    msgs.push(results(&refs[1..]));
                } else {
                    msgs.push(results(&refs));
                }
            }
        }
    }
    (msgs, seqs)
}

fn pairs(msgs: &[Message]) -> (Vec<String>, Vec<String>) {
    let calls = msgs
        .iter()
        .flat_map(|m| m.tool_calls().map(|c| c.id.clone()))
        .collect();
    let res = msgs
        .iter()
        .flat_map(|m| m.tool_results_iter().map(|r| r.id.clone()))
        .collect();
    (calls, res)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn compaction_invariants(
        steps in proptest::collection::vec(step(), 1..60),
        in_flight in any::<bool>(),
        prior in proptest::option::of(0u64..40),
        keep in 0usize..25,
        keep_tokens in proptest::option::of(0u64..400),
    ) {
        let (msgs, seqs) = build(&steps, in_flight, prior);
        let p = CompactionPolicy {
            max_messages: 0,
            keep_recent_messages: keep,
            keep_recent_tokens: keep_tokens,
            ..CompactionPolicy::default()
        };
        let Some(plan) = plan_forced(&msgs, &p, &EstimateCounter) else {
            return Ok(());
        };
        let span = seqs.range_span(&plan.range);
        let out = apply(&msgs, &plan, "SUMMARY", span).unwrap();

        // The kept tail is verbatim.
        let tail = &msgs[plan.range.end..];
        prop_assert_eq!(&out[out.len() - tail.len()..], tail);

        // Calls and results are never separated; in-flight calls are kept.
        let (in_calls, in_results) = pairs(&msgs);
        let (out_calls, out_results) = pairs(&out);
        for id in &in_calls {
            let has_result = in_results.contains(id);
            if has_result {
                prop_assert_eq!(out_calls.contains(id), out_results.contains(id), "pair {} split", id);
            } else {
                prop_assert!(out_calls.contains(id), "in-flight call {} was compacted", id);
            }
        }

        // The latest user request survives verbatim and is still the latest.
        let before = latest_request(&msgs).map(|i| msgs[i].clone());
        let after = latest_request(&out).map(|i| out[i].clone());
        prop_assert_eq!(before, after);

        // System messages are all kept, in order.
        let sys = |v: &[Message]| v.iter().filter(|m| m.role == Role::System).cloned().collect::<Vec<_>>();
        prop_assert_eq!(sys(&msgs), sys(&out));

        // Exactly one new summary, recording the range it replaced.
        let summaries: Vec<SeqSpan> = out.iter().filter_map(summary_span).collect();
        prop_assert_eq!(summaries, vec![span]);
        prop_assert_eq!(span.from, 0);

        // Sequence bookkeeping: kept messages keep their numbers, and the next message
        // appended gets the next number.
        let next = seqs.after(&plan, msgs.len(), span);
        let offset = out.len() - tail.len();
        for (k, j) in (plan.range.end..msgs.len()).enumerate() {
            prop_assert_eq!(next.span_of(offset + k), seqs.span_of(j));
        }
        if let Some(u) = plan.keep_request {
            let pos = out.iter().position(|m| m == &msgs[u] && !is_summary(m)).unwrap();
            prop_assert_eq!(next.span_of(pos), seqs.span_of(u));
        }
        prop_assert_eq!(next.next_seq(out.len()), seqs.next_seq(msgs.len()));
    }

    /// The case of issue #16: a token trigger fires on a turn's second request, after the
    /// turn's one tool result, which is larger than the recent-tail budget. The latest step
    /// (the call and its fresh result) must stay verbatim, whatever the budgets.
    #[test]
    fn a_fresh_tool_result_is_never_summarised(
        steps in proptest::collection::vec(step(), 0..40),
        keep in 0usize..25,
        keep_tokens in proptest::option::of(0u64..400),
        result_words in 50usize..2_000,
        calls in 1usize..4,
    ) {
        let (mut msgs, _) = build(&steps, false, None);
        msgs.push(Message::user("[bench turn=7] read knowledge.md"));
        let ids: Vec<String> = (0..calls).map(|i| format!("fresh{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        msgs.push(assistant_calls(&refs));
        for id in &refs {
            msgs.push(Message::tool_results(vec![ToolResult {
                id: (*id).to_owned(),
                content: "knowledge ".repeat(result_words),
                is_error: false,
                code: None,
            }]));
        }
        let p = CompactionPolicy {
            max_messages: 0,
            keep_recent_messages: keep,
            keep_recent_tokens: keep_tokens,
            trigger_tokens: Some(1),
            ..CompactionPolicy::default()
        };
        if let Some(plan) = plan_compaction(&msgs, &p, &EstimateCounter) {
            let out = apply(&msgs, &plan, "SUMMARY", SeqSpan::one(0)).unwrap();
            let step_at = msgs.len() - 1 - calls;
            prop_assert!(plan.range.end <= step_at, "the latest step was summarised");
            prop_assert_eq!(&out[out.len() - calls - 1..], &msgs[step_at..]);
        }
    }
}

#[test]
fn a_declared_window_wins_over_the_models() {
    let (_, model) = model(Vec::new());
    let c = compactor(CompactorConfig {
        context_window: Some(64_000),
        ..CompactorConfig::default()
    });
    assert_eq!(c.policy_for(model.as_ref()).trigger_tokens, Some(51_200));
    // The summariser's input budget follows it too: 85 % of the declared window, less the
    // prompts and the output budget.
    let budget = c.input_budget(model.as_ref());
    assert!((45_000..54_400 - 4_096).contains(&budget), "{budget}");
}

/// A conversation of `turns` tool turns, each with a result of `chars` characters.
fn tool_turns(turns: usize, chars: usize) -> Vec<Message> {
    let mut msgs = Vec::new();
    for t in 0..turns {
        let id = format!("t{t}");
        msgs.push(Message::user(format!("turn {t}")));
        msgs.push(assistant_calls(&[id.as_str()]));
        msgs.push(Message::tool_results(vec![ToolResult {
            id: id.clone(),
            content: format!("{t} ").repeat(chars / 2),
            is_error: false,
            code: None,
        }]));
        msgs.push(Message::assistant(format!("answer {t}")));
    }
    msgs
}

#[tokio::test]
async fn the_layer_clears_old_tool_results_before_it_summarises() -> Result<()> {
    let (scripted, m) = model(vec![Reply::text("answer")]);
    let c = Arc::new(compactor(CompactorConfig {
        policy: CompactionPolicy {
            trigger_tokens: Some(3_000),
            keep_recent_tokens: Some(1_500),
            ..CompactionPolicy::default()
        },
        ..CompactorConfig::default()
    }));
    let agent = AgentLoop::new(Arc::clone(&m))
        .with_layer(Arc::new(CompactionLayer::new(c, Arc::clone(&m))));
    // 8 results of 2,000 characters: ~4,000 tokens, over the trigger.
    let mut state = AgentState {
        messages: tool_turns(8, 2_000),
        ..AgentState::default()
    };
    run_next(&agent, &mut state).await?;
    let reqs = scripted.requests();
    assert_eq!(reqs.len(), 1, "no summary call: clearing was enough");
    let sent = &reqs[0].messages;
    assert_eq!(sent.len(), 33, "every message is still there");
    let results: Vec<&ToolResult> = sent.iter().flat_map(|m| m.tool_results_iter()).collect();
    let cleared = results
        .iter()
        .filter(|r| r.content.starts_with(CLEARED_PREFIX))
        .count();
    assert!(cleared >= 6, "{cleared} of 8 cleared");
    assert!(
        !results
            .last()
            .is_some_and(|r| r.content.starts_with(CLEARED_PREFIX)),
        "the newest result is in the kept tail"
    );
    // The pointer names the record that holds the whole result (seq = index here).
    assert!(results[0].content.contains("#2 "), "{}", results[0].content);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Clearing keeps every message, every call/result pairing and the latest step, and
    /// only shortens results outside the protected tail.
    #[test]
    fn clearing_keeps_structure_and_the_latest_step(
        turns in 0usize..12,
        chars in 0usize..3_000,
        keep in 0usize..10,
        keep_tokens in proptest::option::of(0u64..2_000),
        fresh in any::<bool>(),
    ) {
        let mut msgs = tool_turns(turns, chars);
        if fresh {
            msgs.push(Message::user("fresh"));
            msgs.push(assistant_calls(&["f1"]));
            msgs.push(results(&["f1"]));
            if let Some(ContentBlock::ToolResult(r)) = msgs.last_mut().and_then(|m| m.content.iter_mut().next()) {
                r.content = "x".repeat(5_000);
            }
        }
        let p = CompactionPolicy {
            keep_recent_messages: keep,
            keep_recent_tokens: keep_tokens,
            ..CompactionPolicy::default()
        };
        let plan = plan_clearing(&msgs, &p, &EstimateCounter);
        let mut state = AgentState { messages: msgs.clone(), ..AgentState::default() };
        clear_results(&mut state, &plan, DEFAULT_CLEAR_RESULT_CHARS);
        let out = &state.messages;
        prop_assert_eq!(out.len(), msgs.len());
        prop_assert_eq!(pairs(out), pairs(&msgs));
        if fresh {
            prop_assert_eq!(&out[out.len() - 2..], &msgs[msgs.len() - 2..]);
        }
        let tail = protected_from(&msgs, &p, &EstimateCounter);
        prop_assert_eq!(&out[tail..], &msgs[tail..]);
        for (a, b) in out.iter().zip(&msgs) {
            prop_assert_eq!(a.role, b.role);
            prop_assert!(a.text_content().len() <= b.text_content().len() + 200);
        }
        // Clearing twice changes nothing more.
        prop_assert!(plan_clearing(out, &p, &EstimateCounter).is_empty());
    }
}

/// Counts how many messages' worth of text it was asked to count.
#[derive(Debug, Default)]
struct CallCounter(std::sync::atomic::AtomicUsize);
impl TokenCounter for CallCounter {
    fn count(&self, text: &str) -> u64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        EstimateCounter.count(text)
    }
    fn name(&self) -> &str {
        "calls"
    }
}

#[test]
fn clearing_counts_only_the_recent_tail() {
    // 400 messages of ~100 tokens; the token tail keeps ~10 of them.
    let msgs: Vec<Message> = (0..400)
        .map(|i| Message::user(format!("word{i} ").repeat(100)))
        .collect();
    let p = CompactionPolicy {
        keep_recent_messages: 50,
        keep_recent_tokens: Some(1_000),
        ..CompactionPolicy::default()
    };
    let counter = CallCounter::default();
    let from = protected_from(&msgs, &p, &counter);
    let all: Vec<u64> = msgs
        .iter()
        .map(|m| message_tokens(&EstimateCounter, m))
        .collect();
    // Same answer as counting everything...
    assert_eq!(from, tail_start(&all, &p).min(cut_limit(&msgs)));
    assert!(from > 350, "the token tail is the smaller one here: {from}");
    // ...from the tail's messages and the one after it only.
    let counted = counter.0.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(counted, msgs.len() - from + 1, "counted {counted} texts");
}

proptest! {
    #[test]
    fn tail_start_by_is_tail_start(
        tokens in proptest::collection::vec(0u64..500, 0..60),
        keep in 0usize..40,
        budget in proptest::option::of(0u64..5_000),
    ) {
        let p = CompactionPolicy {
            keep_recent_messages: keep,
            keep_recent_tokens: budget,
            ..CompactionPolicy::default()
        };
        let mut naive = tokens.len().saturating_sub(keep);
        if let Some(b) = budget {
            let mut suffix = 0;
            let mut c = tokens.len();
            while c > 0 && suffix + tokens[c - 1] <= b {
                suffix += tokens[c - 1];
                c -= 1;
            }
            naive = naive.max(c);
        }
        prop_assert_eq!(tail_start(&tokens, &p), naive);
    }
}

#[test]
fn the_facts_section_is_split_from_the_summary() {
    let (summary, facts) = split_facts(
        "## Intent\nShip it.\n## Progress\n- built the parser\n\n## Facts for long-term memory\n\
         - The user prefers Helix.\n- Deadline is Friday.\n",
    );
    assert_eq!(
        summary,
        "## Intent\nShip it.\n## Progress\n- built the parser"
    );
    assert_eq!(
        facts,
        Some(vec![
            "The user prefers Helix.".to_owned(),
            "Deadline is Friday.".to_owned()
        ])
    );
    // Any heading level and case; "None" is no facts; a later heading goes back to the
    // summary; the last facts heading wins (a summary may quote the first).
    let (summary, facts) = split_facts(
        "## Progress\nquoted: ## Facts for long-term memory\n### FACTS FOR LONG-TERM MEMORY\nNone\n## Next steps\nNone",
    );
    assert_eq!(
        summary,
        "## Progress\nquoted: ## Facts for long-term memory\n## Next steps\nNone"
    );
    assert_eq!(facts, Some(Vec::new()));
    // No section: the whole answer is the summary, and the facts are unknown.
    let (summary, facts) = split_facts("  ## Intent\nShip it.  ");
    assert_eq!(summary, "## Intent\nShip it.");
    assert_eq!(facts, None);
}

/// A hook that records what the layer asked of it, in order, and what it saw.
#[derive(Debug)]
struct Hook {
    plan: FactsPlan,
    seen: std::sync::Mutex<Vec<String>>,
}

impl Hook {
    fn new(plan: FactsPlan) -> Arc<Self> {
        Arc::new(Self {
            plan,
            seen: std::sync::Mutex::default(),
        })
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

#[async_trait]
impl BeforeCompaction for Hook {
    async fn before_compaction(&self, cx: &mut CallCtx<'_>) {
        // The messages are still all there when the hook flushes.
        let n = cx.state.messages.len();
        self.seen.lock().unwrap().push(format!("flush over {n}"));
    }

    async fn plan_facts(&self, _cx: &mut CallCtx<'_>, span: SeqSpan) -> FactsPlan {
        self.seen
            .lock()
            .unwrap()
            .push(format!("plan #{}..#{}", span.from, span.to));
        self.plan.clone()
    }

    async fn record_facts(&self, cx: &mut CallCtx<'_>, request: &FactsRequest, facts: Vec<String>) {
        let n = cx.state.messages.len();
        self.seen.lock().unwrap().push(format!(
            "record #{}..#{} over {n}: {}",
            request.span.from,
            request.span.to,
            facts.join(" | ")
        ));
    }
}

/// Runs one call ("next") over three turns with a layer that compacts past 10 messages
/// (keeping 4), with `hook` if any; the model answers `summary`, then "answer". Returns the
/// model's requests and the state.
async fn compact_next(
    hook: Option<Arc<Hook>>,
    summary: &str,
) -> Result<(Vec<ModelRequest>, AgentState)> {
    let (scripted, m) = model(vec![Reply::text(summary), Reply::text("answer")]);
    let c = Arc::new(compactor(CompactorConfig {
        policy: CompactionPolicy {
            max_messages: 10,
            keep_recent_messages: 4,
            ..CompactionPolicy::default()
        },
        ..CompactorConfig::default()
    }));
    let mut layer = CompactionLayer::new(c, Arc::clone(&m));
    if let Some(hook) = hook {
        layer = layer.with_before_compaction(hook);
    }
    let agent = AgentLoop::new(Arc::clone(&m)).with_layer(Arc::new(layer));
    let mut state = AgentState {
        messages: long_conversation(3),
        ..AgentState::default()
    };
    run_next(&agent, &mut state).await?;
    Ok((scripted.requests(), state))
}

fn ask(from: u64, to: u64) -> FactsPlan {
    FactsPlan::Ask(FactsRequest {
        span: SeqSpan { from, to },
        instructions: "FACTS PLEASE: end with ## Facts for long-term memory".into(),
        max_tokens: 700,
    })
}

#[tokio::test]
async fn facts_asked_of_the_summary_cost_no_call_of_their_own() -> Result<()> {
    let hook = Hook::new(ask(0, 8));
    let (reqs, state) = compact_next(
        Some(hook.clone()),
        "## Intent\nwork\n## Facts for long-term memory\n- The user likes tea.\n",
    )
    .await?;
    // One summary call (asked for the facts, with room for them), then the request.
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].system, SUMMARY_SYSTEM_PROMPT);
    let prompt = reqs[0].messages[0].text_content();
    let (instructions, transcript) = prompt.split_once("\n\n---\n\n").unwrap();
    assert!(instructions.starts_with(SUMMARY_PROMPT));
    assert!(instructions.ends_with("FACTS PLEASE: end with ## Facts for long-term memory"));
    assert!(transcript.contains("#0 user: request 0"));
    assert_eq!(
        reqs[0].params.max_tokens,
        Some(DEFAULT_SUMMARY_MAX_TOKENS + 700)
    );
    // The facts were recorded before the summary replaced the messages (13 then), and the
    // summary in the state is the summary alone.
    assert_eq!(
        hook.seen(),
        vec![
            "plan #0..#8".to_owned(),
            "record #0..#8 over 13: The user likes tea.".to_owned()
        ]
    );
    let summary = state.messages[0].text_content();
    assert!(summary.ends_with("## Intent\nwork"), "{summary}");
    assert!(!summary.contains("tea"), "{summary}");
    Ok(())
}

#[tokio::test]
async fn a_summary_without_the_facts_section_is_followed_by_a_flush_before_it_applies() -> Result<()>
{
    let hook = Hook::new(ask(0, 8));
    let (reqs, state) = compact_next(Some(hook.clone()), "## Intent\nwork").await?;
    assert_eq!(reqs.len(), 2);
    // The separate flush ran after the summary call, over the messages not yet replaced.
    assert_eq!(
        hook.seen(),
        vec!["plan #0..#8".to_owned(), "flush over 13".to_owned()]
    );
    assert!(is_summary(&state.messages[0]));
    Ok(())
}

#[tokio::test]
async fn the_hook_decides_between_nothing_and_a_separate_flush() -> Result<()> {
    let hook = Hook::new(FactsPlan::Nothing);
    let (reqs, _) = compact_next(Some(hook.clone()), "## Intent\nwork").await?;
    assert_eq!(hook.seen(), vec!["plan #0..#8".to_owned()]);
    // Not asked: the summary call is the plain one.
    assert_eq!(reqs[0].messages[0].text_content().find("FACTS"), None);
    assert_eq!(reqs[0].params.max_tokens, Some(DEFAULT_SUMMARY_MAX_TOKENS));

    let hook = Hook::new(FactsPlan::Separate);
    // Even an answer with a facts section is not read as facts when none were asked.
    let (_, state) = compact_next(
        Some(hook.clone()),
        "## Intent\nwork\n## Facts for long-term memory\n- x",
    )
    .await?;
    assert_eq!(
        hook.seen(),
        vec!["plan #0..#8".to_owned(), "flush over 13".to_owned()]
    );
    assert!(state.messages[0].text_content().contains("- x"));
    Ok(())
}

/// 70 messages of plain text (~52,000 tokens by the estimate), as a conversation reaches
/// the token trigger of a 64K window.
fn plain_text_conversation() -> Vec<Message> {
    let text = "plain words of a long conversation ".repeat(99);
    (0..70)
        .map(|i| {
            if i % 2 == 0 {
                Message::user(format!("{i} {text}"))
            } else {
                Message::assistant(format!("{i} {text}"))
            }
        })
        .collect()
}

/// A compactor for a declared 64K window, and a state holding [`plain_text_conversation`].
fn plain_text_at_64k() -> (Compactor, AgentState) {
    let c = compactor(CompactorConfig {
        context_window: Some(64_000),
        ..CompactorConfig::default()
    });
    let state = AgentState {
        messages: plain_text_conversation(),
        ..AgentState::default()
    };
    (c, state)
}

#[tokio::test]
async fn a_plain_text_conversation_at_the_trigger_is_summarised_in_one_call() -> Result<()> {
    let (scripted, m) = model(vec![Reply::text("## Intent\nthe summary")]);
    let (c, mut state) = plain_text_at_64k();
    let before: u64 = state
        .messages
        .iter()
        .map(|m| message_tokens(&EstimateCounter, m))
        .sum();
    assert!(before > 51_200, "{before} tokens do not reach the trigger");
    let report = c.compact(&mut state, &m).await?.unwrap();
    // More than half the window is summarised, in one call (at half the window as the
    // budget it took two parts and a merge).
    let summarised: u64 = before - 8_000;
    assert!(
        EstimateCounter.count(&scripted.requests()[0].messages[0].text_content()) > 32_000,
        "summarised {summarised}"
    );
    assert_eq!(report.model_calls, 1, "{report:?}");
    assert_eq!(scripted.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_summary_over_the_providers_window_is_made_again_in_parts() -> Result<()> {
    let mut replies = vec![Reply::Fail(ModelError::ContextOverflow {
        message: "maximum context length exceeded".into(),
    })];
    replies.extend((0..10).map(|i| Reply::text(&format!("part {i}"))));
    let (scripted, m) = model(replies);
    let (c, mut state) = plain_text_at_64k();
    let report = c.compact(&mut state, &m).await?.unwrap();
    let reqs = scripted.requests();
    // The refused call, then parts of half the budget and their merge; all counted.
    assert!(reqs.len() >= 4, "{}", reqs.len());
    assert_eq!(report.model_calls as usize, reqs.len());
    assert!(
        reqs[1].messages[0]
            .text_content()
            .contains("This is part 1 of")
    );
    let half = c.input_budget(m.as_ref()) / 2;
    let first = EstimateCounter.count(&reqs[0].messages[0].text_content());
    assert!(first > half, "{first}");
    for r in &reqs[1..] {
        // The part's transcript within half the budget, plus the instructions.
        let t = EstimateCounter.count(&r.messages[0].text_content());
        assert!(
            t <= half + 300,
            "a part of {t} tokens, half the budget {half}"
        );
    }
    assert!(
        reqs.last().unwrap().messages[0]
            .text_content()
            .starts_with(MERGE_PROMPT)
    );
    assert!(is_summary(&state.messages[0]));
    Ok(())
}
