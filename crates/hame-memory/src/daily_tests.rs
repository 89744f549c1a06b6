#![allow(clippy::unwrap_used)]

use super::*;
use crate::test_support::at;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{ModelError, ToolCall, ToolResult};
use pretty_assertions::assert_eq;
use proptest::prelude::*;

#[test]
fn daily_paths_round_trip() {
    let d = NaiveDate::from_ymd_opt(2026, 3, 4).unwrap();
    assert_eq!(daily_log_path(d), "memory/2026-03-04.md");
    assert_eq!(parse_daily_log_path("memory/2026-03-04.md"), Some(d));
    assert_eq!(parse_daily_log_path("memory/archive/2026-03-04.md"), None);
    assert_eq!(parse_daily_log_path("memory/notes.md"), None);
    assert_eq!(parse_daily_log_path("memory/2026-13-04.md"), None);
    assert_eq!(parse_daily_log_path("MEMORY.md"), None);
}

#[test]
fn parses_bullets_of_many_shapes() {
    let answer = "Here are the facts:\n\
        - The user prefers Rust.\n\
        * Deploys happen on Fridays\n\x20\x20because traffic is low.\n\
        1. Alice owns the billing service\n\
        2) Deadline: 2026-04-01\n\
        • 用户喜欢喝咖啡\n\
        ```\n- inside fence still a bullet\n```\n\
        # heading\n\
        -\n\
        plain prose is ignored\n";
    assert_eq!(
        parse_bullets(answer),
        vec![
            "The user prefers Rust.",
            "Deploys happen on Fridays because traffic is low.",
            "Alice owns the billing service",
            "Deadline: 2026-04-01",
            "用户喜欢喝咖啡",
            "inside fence still a bullet",
        ]
    );
    assert!(parse_bullets("NO_REPLY").is_empty());
    assert!(parse_bullets("  `NO_REPLY`\n").is_empty());
    assert!(parse_bullets("").is_empty());
}

#[test]
fn dedupes_against_existing_and_itself() {
    let existing = "# Memory\n- The user prefers Rust.\n## 10:00 UTC · session s · messages #0..#3\n- Deploys on Fridays\n";
    let got = new_facts(
        [existing],
        vec![
            "the user prefers rust".into(),
            "Deploys on Fridays!".into(),
            "Alice owns billing".into(),
            "alice owns  billing.".into(),
            "  ".into(),
        ],
    );
    assert_eq!(got, vec!["Alice owns billing".to_owned()]);
}

#[test]
fn renders_a_flush_section() {
    let s = render_flush_section(
        at(9, 5),
        "s1",
        SeqSpan { from: 3, to: 9 },
        &["a".into(), "b".into()],
    );
    assert_eq!(
        s,
        "\n## 09:05 UTC · session s1 · messages #3..#9\n- a\n- b\n"
    );
}

fn conversation() -> Vec<Message> {
    vec![
        Message::user("I prefer Rust and deploy on Fridays"),
        Message {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolCall(ToolCall {
                id: "1".into(),
                name: "write_file".into(),
                arguments: format!("{{\"content\":\"{}\"}}", "x".repeat(2_000)),
            })]
            .into(),
            usage: None,
        },
        Message::tool_results(vec![ToolResult {
            id: "1".into(),
            content: "y".repeat(5_000),
            is_error: false,
            code: None,
        }]),
        Message::assistant("Noted."),
    ]
}

/// An image is named in the flush transcript, never pasted as base64.
#[test]
fn an_image_is_named_not_pasted_in_the_transcript() {
    let image = crate::test_support::big_image();
    let state = AgentState {
        messages: vec![Message::user_with_images("my cat", vec![image.clone()])],
        ..AgentState::default()
    };
    let (t, _) = pending_transcript(&state, &FlushOptions::default()).unwrap();
    assert_eq!(t, format!("#0 user: my cat\n{}\n\n", image.describe()));
    assert!(!t.contains("iVBOR"));
}

#[test]
fn transcript_starts_at_the_watermark_and_clips_tool_io() {
    let mut state = AgentState {
        messages: conversation(),
        ..AgentState::default()
    };
    let (t, span) = pending_transcript(&state, &FlushOptions::default()).unwrap();
    assert_eq!(span, SeqSpan { from: 0, to: 3 });
    assert!(t.starts_with("#0 user: I prefer Rust"));
    assert!(t.contains("[tool_call write_file("));
    assert!(t.len() < 3_000, "tool I/O is clipped: {}", t.len());
    MemoryState {
        flushed_through: Some(3),
        last_flush: None,
    }
    .store(&mut state)
    .unwrap();
    assert_eq!(pending_transcript(&state, &FlushOptions::default()), None);
    state.messages.push(Message::user("new"));
    let (t, span) = pending_transcript(&state, &FlushOptions::default()).unwrap();
    assert_eq!(span, SeqSpan::one(4));
    assert_eq!(t, "#4 user: new\n\n");
}

#[test]
fn transcript_includes_a_summary_covering_unflushed_messages() {
    let mut state = AgentState {
        messages: vec![
            crate::compaction::summary_message(SeqSpan { from: 0, to: 9 }, "did things"),
            Message::user("after"),
        ],
        ..AgentState::default()
    };
    CompactionState {
        head: vec![SeqSpan { from: 0, to: 9 }],
        tail_seq: 10,
        history: vec![],
    }
    .store(&mut state)
    .unwrap();
    MemoryState {
        flushed_through: Some(4),
        last_flush: None,
    }
    .store(&mut state)
    .unwrap();
    let (t, span) = pending_transcript(&state, &FlushOptions::default()).unwrap();
    assert_eq!(span, SeqSpan { from: 5, to: 10 });
    assert!(t.contains("summary of earlier messages"));
    assert!(t.contains("#10 user: after"));
}

#[tokio::test]
async fn flush_appends_new_facts_and_advances_the_watermark() -> Result<()> {
    let files = Arc::new(InMemoryFiles::new());
    files
        .write_atomic("MEMORY.md", "# Memory\n- The user prefers Rust\n")
        .await?;
    let model = ScriptedModel::new([
        Reply::text("- The user prefers Rust\n- Deploys happen on Fridays"),
        Reply::text("NO_REPLY"),
    ]);
    let flusher = MemoryFlusher::new(
        files.clone(),
        Arc::new(model.clone()),
        FlushOptions::default(),
    );
    let mut state = AgentState {
        messages: conversation(),
        ..AgentState::default()
    };
    let r = flusher.flush(&mut state, "s1", at(10, 0)).await?;
    assert_eq!(
        r,
        FlushReport {
            span: Some(SeqSpan { from: 0, to: 3 }),
            path: Some("memory/2026-03-14.md".into()),
            appended: 1,
            more: false,
        }
    );
    assert_eq!(
        files
            .snapshot()
            .get("memory/2026-03-14.md")
            .map(String::as_str),
        Some("\n## 10:00 UTC · session s1 · messages #0..#3\n- Deploys happen on Fridays\n")
    );
    assert_eq!(MemoryState::load(&state).flushed_through, Some(3));
    let req = &model.requests()[0];
    assert_eq!(req.system, FLUSH_SYSTEM_PROMPT);
    let prompt = req.messages[0].text_content();
    assert!(prompt.contains("- The user prefers Rust"));
    assert!(prompt.contains("New conversation messages #0..#3"));

    // Nothing pending: no model call.
    let r = flusher.flush(&mut state, "s1", at(10, 5)).await?;
    assert_eq!(r.span, None);
    assert_eq!(model.requests().len(), 1);

    // New message, model says NO_REPLY: nothing appended, watermark advanced.
    state.messages.push(Message::user("thanks"));
    let r = flusher.flush(&mut state, "s1", at(10, 10)).await?;
    assert_eq!((r.appended, r.path), (0, None));
    assert_eq!(MemoryState::load(&state).flushed_through, Some(4));
    Ok(())
}

#[tokio::test]
async fn failed_flush_keeps_the_watermark() -> Result<()> {
    let files = Arc::new(InMemoryFiles::new());
    let model = ScriptedModel::new([Reply::Fail(ModelError::Transport {
        message: "down".into(),
        source: None,
    })]);
    let flusher = MemoryFlusher::new(files.clone(), Arc::new(model), FlushOptions::default());
    let mut state = AgentState {
        messages: conversation(),
        ..AgentState::default()
    };
    let before = state.clone();
    assert!(flusher.flush(&mut state, "s", at(1, 0)).await.is_err());
    assert_eq!(state, before);
    assert!(files.snapshot().is_empty());
    Ok(())
}

#[tokio::test]
async fn long_backlogs_are_flushed_in_pieces() -> Result<()> {
    let files = Arc::new(InMemoryFiles::new());
    let model = ScriptedModel::new([Reply::text("- a"), Reply::text("- b"), Reply::text("- c")]);
    let flusher = MemoryFlusher::new(
        files.clone(),
        Arc::new(model),
        FlushOptions {
            max_transcript_chars: 300,
            ..FlushOptions::default()
        },
    );
    let mut state = AgentState {
        messages: (0..6)
            .map(|i| Message::user(format!("{i} {}", "w".repeat(100))))
            .collect(),
        ..AgentState::default()
    };
    let r1 = flusher.flush(&mut state, "s", at(1, 0)).await?;
    assert_eq!((r1.span, r1.more), (Some(SeqSpan { from: 0, to: 1 }), true));
    let r2 = flusher.flush(&mut state, "s", at(1, 1)).await?;
    assert_eq!(r2.span, Some(SeqSpan { from: 2, to: 3 }));
    let r3 = flusher.flush(&mut state, "s", at(1, 2)).await?;
    assert_eq!(
        (r3.span, r3.more),
        (Some(SeqSpan { from: 4, to: 5 }), false)
    );
    Ok(())
}

#[tokio::test]
async fn in_memory_files_list_only_direct_children() -> Result<()> {
    let f = InMemoryFiles::new();
    f.append("memory/a.md", "x").await?;
    f.append("memory/a.md", "y").await?;
    f.write_atomic("memory/archive/b.md", "z").await?;
    f.write_atomic("memoryx/c.md", "z").await?;
    assert_eq!(f.list("memory").await?, vec!["memory/a.md".to_owned()]);
    assert_eq!(f.read("memory/a.md").await?, Some("xy".into()));
    assert_eq!(f.read("nope").await?, None);
    Ok(())
}

proptest! {
    /// Rendering facts as a section and parsing them back gives the same facts, and
    /// deduplicating a second time against the result adds nothing.
    #[test]
    fn bullets_round_trip(facts in proptest::collection::vec("[a-zA-Z0-9 ,.'咖啡]{1,60}", 0..10)) {
        let facts: Vec<String> = facts
            .into_iter()
            .map(|f| f.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|f| !f.is_empty() && f != NO_REPLY)
            .collect();
        let fresh = new_facts([], facts.clone());
        let log = render_flush_section(at(1, 0), "s", SeqSpan::one(0), &fresh);
        prop_assert_eq!(parse_bullets(&log), fresh.clone());
        prop_assert!(new_facts([log.as_str()], facts).is_empty());
    }
}

#[tokio::test]
async fn facts_asked_of_a_summary_start_at_the_watermark_and_are_recorded_like_a_flush()
-> Result<()> {
    let files = Arc::new(InMemoryFiles::new());
    files
        .write_atomic("MEMORY.md", "# Memory\n- The user prefers Rust\n")
        .await?;
    let now = at(10, 30);
    let today = daily_log_path(now.date_naive());
    files
        .append(
            &today,
            "\n## 09:00 UTC · session s · messages #0..#1\n- Deploys on Fridays\n",
        )
        .await?;
    // No model call is made by either method.
    let model: Arc<dyn Model> = Arc::new(ScriptedModel::new([]));
    let flusher = MemoryFlusher::new(files.clone(), model, FlushOptions::default());
    let mut state = AgentState {
        messages: conversation(),
        ..AgentState::default()
    };
    MemoryState {
        flushed_through: Some(1),
        last_flush: None,
    }
    .store(&mut state)?;

    // The summarised span #0..#3, of which #2.. is not recorded yet.
    let request = flusher
        .facts_request(&state, SeqSpan { from: 0, to: 3 }, now)
        .await?
        .unwrap();
    assert_eq!(request.span, SeqSpan { from: 2, to: 3 });
    assert_eq!(request.max_tokens, DEFAULT_FLUSH_MAX_TOKENS);
    let i = &request.instructions;
    assert!(i.contains("`## Facts for long-term memory`"), "{i}");
    assert!(i.contains("messages #2..#3"), "{i}");
    assert!(i.contains("- The user prefers Rust"), "{i}");
    assert!(i.contains("- Deploys on Fridays"), "{i}");

    // Known facts are dropped, new ones appended under the span; the watermark moves on.
    let report = flusher
        .record_facts(
            &mut state,
            "s",
            now,
            &request,
            vec!["the user prefers rust".into(), "Alice owns billing".into()],
        )
        .await?;
    assert_eq!(report.appended, 1);
    assert_eq!(report.path.as_deref(), Some(today.as_str()));
    let log = files.snapshot()[&today].clone();
    assert!(
        log.ends_with("## 10:30 UTC · session s · messages #2..#3\n- Alice owns billing\n"),
        "{log}"
    );
    assert_eq!(MemoryState::load(&state).flushed_through, Some(3));

    // Past the watermark there is nothing to ask; recording an older span never moves the
    // watermark back.
    assert_eq!(
        flusher
            .facts_request(&state, SeqSpan { from: 0, to: 3 }, now)
            .await?,
        None
    );
    let old = FactsRequest {
        span: SeqSpan { from: 0, to: 1 },
        ..request
    };
    flusher
        .record_facts(&mut state, "s", now, &old, Vec::new())
        .await?;
    assert_eq!(MemoryState::load(&state).flushed_through, Some(3));
    Ok(())
}
