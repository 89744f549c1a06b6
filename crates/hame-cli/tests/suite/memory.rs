//! Memory and context management end to end: one long session of `hame run` processes
//! against a scripted server that answers the flush, consolidation and summary prompts.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use hame::memory::compaction::SUMMARY_SYSTEM_PROMPT;
use hame::memory::consolidate::CONSOLIDATION_SYSTEM_PROMPT;
use hame::memory::daily::FLUSH_SYSTEM_PROMPT;
use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};
use serde_json::{Value, json};

use super::common::{chat, last_tool_result, run_with, stderr, stdout, system_of};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Turns of the long session (each one `hame run` process).
const TURNS: usize = 64;
/// The turn that asks for the 300 KB file.
const BIG_TURN: usize = 20;
/// The turn whose first request overflows the context.
const OVERFLOW_TURN: usize = 44;

fn kind(req: &RecordedRequest) -> &'static str {
    let sys = system_of(&req.body);
    if sys == FLUSH_SYSTEM_PROMPT {
        "flush"
    } else if sys == CONSOLIDATION_SYSTEM_PROMPT {
        "consolidate"
    } else if sys == SUMMARY_SYSTEM_PROMPT {
        "summary"
    } else {
        "chat"
    }
}

fn messages(req: &RecordedRequest) -> Vec<Value> {
    req.body["messages"].as_array().cloned().unwrap_or_default()
}

/// The scripted model: facts for the flush prompt, a merged file for consolidation, a
/// summary for compaction, tool calls for `search-memory`/`search-sessions`/`read-big`,
/// one context overflow for `OVERFLOW`, else a short text.
/// With `facts_in_summary`, a summary asked for facts ends with their section, as a model
/// that follows the instructions does; otherwise it is the summary alone.
fn responder(
    overflowed: Arc<AtomicBool>,
    facts_in_summary: bool,
) -> impl Fn(&RecordedRequest) -> ScriptStep {
    let ids = AtomicUsize::new(0);
    move |req: &RecordedRequest| {
        let prompt = req.last_user_text().unwrap_or_default();
        match kind(req) {
            "flush" => {
                let new = prompt
                    .split_once("New conversation messages")
                    .map_or("", |(_, rest)| rest);
                let facts: Vec<String> = new
                    .lines()
                    .filter_map(|l| l.split_once("remember: ").map(|(_, f)| format!("- {f}")))
                    .collect();
                ScriptStep::text(if facts.is_empty() {
                    "NO_REPLY".to_owned()
                } else {
                    facts.join("\n")
                })
            }
            "consolidate" => {
                let mut facts: Vec<&str> = prompt
                    .lines()
                    .map(str::trim)
                    .filter(|l| l.starts_with("- "))
                    .collect();
                facts.dedup();
                ScriptStep::text(format!("# Memory\n\n## Facts\n{}\n", facts.join("\n")))
            }
            "summary" => ScriptStep::text(format!(
                "## Intent\nA long test conversation.\n## Progress\nTurns answered.\n\
                 ## Artifacts\nNone\n## Next steps\nNone{}",
                if facts_in_summary {
                    summary_facts(&prompt)
                } else {
                    String::new()
                }
            )),
            _ => {
                let msgs = messages(req);
                if msgs.last().is_some_and(|m| m["role"] == "tool") {
                    return ScriptStep::text("done with the tool");
                }
                let id = format!("call_{}", ids.fetch_add(1, Ordering::Relaxed));
                if prompt.contains("OVERFLOW") && !overflowed.swap(true, Ordering::SeqCst) {
                    ScriptStep::openai_context_overflow()
                } else if let Some(q) = prompt.strip_prefix("search-memory ") {
                    ScriptStep::tool_call(id, "memory_search", json!({"query": q}))
                } else if let Some(q) = prompt.strip_prefix("search-sessions ") {
                    ScriptStep::tool_call(id, "session_search", json!({"query": q}))
                } else if prompt.starts_with("read-big") {
                    ScriptStep::tool_call(id, "read_file", json!({"file_path": "big.txt"}))
                } else {
                    ScriptStep::text(format!(
                        "ok: {}",
                        prompt.chars().take(40).collect::<String>()
                    ))
                }
            }
        }
    }
}

/// The facts section of a summary asked for facts: the `remember:` messages among those it
/// names (`messages #a..#b`), or `None`. Empty when no facts were asked.
fn summary_facts(prompt: &str) -> String {
    let Some((instructions, transcript)) = prompt.split_once("\n\n---\n\n") else {
        return String::new();
    };
    let Some(range) = instructions
        .split_once("NEW durable facts of messages #")
        .and_then(|(_, rest)| rest.split_once(' '))
        .map(|(range, _)| range)
        .and_then(|r| r.split_once("..#"))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
    else {
        return String::new();
    };
    let facts: Vec<String> = transcript
        .lines()
        .filter_map(|l| {
            let (seq, rest) = l.strip_prefix('#')?.split_once(" user: remember: ")?;
            let seq: u64 = seq.parse().ok()?;
            (range.0..=range.1)
                .contains(&seq)
                .then(|| format!("- {rest}"))
        })
        .collect();
    format!(
        "\n## Facts for long-term memory\n{}",
        if facts.is_empty() {
            "None".to_owned()
        } else {
            facts.join("\n")
        }
    )
}

fn message_for(turn: usize) -> String {
    match turn {
        0 => "remember: my favourite editor is Helix".into(),
        1 => "remember: 用户喜欢喝乌龙茶".into(),
        5 => "remember: the project codename is Falcon".into(),
        BIG_TURN => "read-big please".into(),
        OVERFLOW_TURN => "OVERFLOW turn: tell me something".into(),
        50 => "search-memory Helix".into(),
        51 => "search-memory 乌龙茶".into(),
        52 => "search-sessions codename Falcon".into(),
        53 => "search-memory codename".into(),
        // ~110 tokens each, so that the token trigger of the declared window fires.
        t => format!(
            "turn {t}: let us talk about topic number {t} for a while. {}",
            "Some more words about this topic. ".repeat(12)
        ),
    }
}

fn home(ws: &Path) -> std::path::PathBuf {
    ws.join("alice")
}

#[tokio::test]
async fn a_long_session_compacts_flushes_consolidates_offloads_and_searches() -> TestResult {
    let server = ScriptedServer::start().await?;
    let overflowed = Arc::new(AtomicBool::new(false));
    server.set_responder(responder(overflowed.clone(), false));
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    // A 300 KB file in the workspace template.
    let big: String = (0..2_000)
        .map(|i| format!("{i:06} {}\n", "x".repeat(143)))
        .collect();
    assert!(big.len() >= 300_000);
    fs::write(ws.join("big.txt"), &big)?;
    let ws_s = ws.to_string_lossy().into_owned();
    let args = [
        "--workspace",
        ws_s.as_str(),
        "--user",
        "alice",
        "--session",
        "long",
        // Compaction by tokens (80 % of this window) within the test's 64 turns; the
        // message backstop (200) is not reached.
        "--context-window",
        "12000",
    ];

    let mut tool_results = Vec::new();
    for turn in 0..TURNS {
        let before = server.request_count();
        let out = run_with(
            dir.path(),
            &server.base_url(),
            &args,
            &message_for(turn),
            &[],
        )
        .await?;
        assert_eq!(out.status.code(), Some(0), "turn {turn}: {}", stderr(&out));
        assert!(!stdout(&out).trim().is_empty(), "turn {turn}");
        // The answer to the tool result of this turn, if any.
        let reqs = server.requests();
        if let Some(r) = reqs[before..]
            .iter()
            .filter(|r| kind(r) == "chat")
            .find(|r| messages(r).last().is_some_and(|m| m["role"] == "tool"))
        {
            tool_results.push((turn, last_tool_result(&r.body)));
        }
    }

    let reqs = server.requests();
    let chats: Vec<&RecordedRequest> = reqs.iter().filter(|r| kind(r) == "chat").collect();
    let count = |k: &str| reqs.iter().filter(|r| kind(r) == k).count();
    // One after-call flush (80 unflushed messages) and one before each compaction.
    assert!(count("flush") >= 2, "flushes: {}", count("flush"));
    assert!(count("summary") >= 2, "summaries: {}", count("summary"));
    assert!(count("consolidate") >= 1);

    // Compaction: the request's message count drops, and the summary is in the prompt.
    let sizes: Vec<usize> = chats.iter().map(|r| messages(r).len()).collect();
    assert!(
        sizes.windows(2).any(|w| w[1] + 10 < w[0]),
        "no drop in message counts: {sizes:?}"
    );
    let last = chats.last().ok_or("no chat request")?;
    assert!(
        messages(last).iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("[summary of messages #"))),
        "no summary in the last request"
    );
    // The prompt stays under its budget (80 % of the declared window, ~51,000 characters,
    // plus the turn's own messages), never anything near the 300 KB result.
    for r in &chats {
        let len = r.body.to_string().len();
        assert!(len < 60_000, "a request of {len} bytes");
    }

    // The context overflow was recovered by compacting and retrying.
    assert!(overflowed.load(Ordering::SeqCst));
    let overflow_at = chats
        .iter()
        .position(|r| r.last_user_text().is_some_and(|t| t.contains("OVERFLOW")))
        .ok_or("no overflow request")?;
    let retry = chats[overflow_at + 1];
    assert!(
        retry
            .last_user_text()
            .is_some_and(|t| t.contains("OVERFLOW"))
    );
    assert!(
        messages(retry).len() < messages(chats[overflow_at]).len(),
        "the retry was not compacted: {} vs {}",
        messages(retry).len(),
        messages(chats[overflow_at]).len()
    );

    // The 300 KB result was offloaded; the model saw a preview; the log has it all.
    let (_, preview) = tool_results
        .iter()
        .find(|(t, _)| *t == BIG_TURN)
        .ok_or("no tool result for the big turn")?;
    assert!(preview.contains("too large for the context"), "{preview}");
    assert!(preview.contains("/large_tool_results/"), "{preview}");
    assert!(preview.len() < 10_000);
    let offloaded: Vec<_> =
        fs::read_dir(home(&ws).join("large_tool_results"))?.collect::<Result<Vec<_>, _>>()?;
    assert_eq!(offloaded.len(), 1);
    // With offloading on, read_file may return up to 1,000,000 characters: the whole file.
    let saved = fs::read_to_string(offloaded[0].path())?;
    assert!(saved.len() > 300_000, "{}", saved.len());
    assert!(
        saved.starts_with("     1\t000000 xxx") || saved.contains("000000 xxx"),
        "{}",
        &saved[..200]
    );
    let log = fs::read_to_string(home(&ws).join("agents/hame/sessions/long.log.jsonl"))?;
    let logged: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|r| r["message"]["content"].as_array().cloned())
        .flatten()
        .filter_map(|b| b["content"].as_str().map(str::to_owned))
        .filter(|c| c.len() > 300_000)
        .collect();
    // The log keeps the full result, exactly what was offloaded.
    assert_eq!(logged.len(), 1);
    assert!(logged[0] == saved, "the log does not hold the full result");

    // Layer 1: the daily log holds the facts; layer 2: MEMORY.md was consolidated.
    let logs: Vec<_> = fs::read_dir(home(&ws).join("memory"))?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() == 13 && n.ends_with(".md"))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let daily = fs::read_to_string(home(&ws).join("memory").join(&logs[0]))?;
    for fact in [
        "my favourite editor is Helix",
        "用户喜欢喝乌龙茶",
        "the project codename is Falcon",
    ] {
        assert_eq!(daily.matches(fact).count(), 1, "{fact} in {daily}");
    }
    let memory_md = fs::read_to_string(home(&ws).join("MEMORY.md"))?;
    assert!(memory_md.starts_with("# Memory\n"), "{memory_md}");
    assert!(memory_md.contains("Helix"), "{memory_md}");
    // MEMORY.md reaches the system prompt.
    assert!(system_of(&last.body).contains("favourite editor is Helix"));

    // The searches found old facts, also the Chinese one, and the session log hit.
    let result_of = |turn: usize| {
        tool_results
            .iter()
            .find(|(t, _)| *t == turn)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    let helix = result_of(50);
    assert!(helix.contains("**Helix**"), "{helix}");
    assert!(
        helix.contains("MEMORY.md:") || helix.contains("memory/"),
        "{helix}"
    );
    let tea = result_of(51);
    assert!(tea.contains("乌龙茶"), "{tea}");
    let sessions = result_of(52);
    assert!(sessions.contains("session long · #10:"), "{sessions}");
    assert!(sessions.contains("Falcon"), "{sessions}");
    assert!(result_of(53).contains("Falcon"), "{}", result_of(53));

    // The state's watermark is saved (the flush ran after calls and before compactions).
    let state_text = fs::read_to_string(
        super::common::state_dir(dir.path(), &ws).join("hame/users/alice/long.json"),
    )?;
    assert!(state_text.contains("\"flushed_through\""), "{state_text}");
    Ok(())
}

/// A model that answers the facts section of a summary (`hame chat`, `/compact`): the
/// compaction is one model call (no flush call of its own), the facts reach the daily log
/// once, the summary in the conversation is the summary alone, and the watermark follows
/// the summarised messages.
#[tokio::test]
async fn a_summary_that_answers_the_facts_is_the_only_call_of_a_compaction() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.set_responder(responder(Arc::new(AtomicBool::new(true)), true));
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(&ws)?;
    let ws_s = ws.to_string_lossy().into_owned();
    let state_home = dir.path().join("state");
    let state_s = state_home.to_string_lossy().into_owned();
    let base = server.base_url();
    // 16 messages (32 with the answers), of which the oldest are summarised, then one more.
    let mut input = "remember: my favourite editor is Helix\nhello there\n\
                     remember: the project codename is Falcon\n"
        .to_owned();
    for i in 0..13 {
        input.push_str(&format!("filler message {i}\n"));
    }
    input.push_str("/compact\nafter\n/quit\n");
    let out = chat(
        dir.path(),
        &[
            "--workspace",
            &ws_s,
            "--model",
            "openai:m",
            "--user",
            "alice",
            "--session",
            "facts",
        ],
        &[("OPENAI_BASE_URL", &base), ("HAME_STATE_HOME", &state_s)],
        &input,
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let reqs = server.requests();
    let kinds: Vec<&str> = reqs.iter().map(kind).collect();
    let mut expected = vec!["chat"; 16];
    expected.extend(["summary", "chat"]);
    assert_eq!(kinds, expected, "{}", stderr(&out));
    let prompt = reqs[16].last_user_text().unwrap_or_default();
    assert!(
        prompt.contains("`## Facts for long-term memory`"),
        "{prompt}"
    );

    let memory = home(&ws).join("memory");
    let logs: Vec<_> = fs::read_dir(&memory)?.collect::<Result<Vec<_>, _>>()?;
    assert_eq!(logs.len(), 1);
    let daily = fs::read_to_string(logs[0].path())?;
    for fact in [
        "my favourite editor is Helix",
        "the project codename is Falcon",
    ] {
        assert_eq!(daily.matches(fact).count(), 1, "{fact} in {daily}");
    }
    assert!(
        daily.contains("· session facts · messages #0..#"),
        "{daily}"
    );

    // The summary the model sees next is the summary alone.
    let summary = messages(&reqs[17])
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .find(|c| c.starts_with("[summary of messages #"))
        .ok_or("no summary in the request after /compact")?;
    assert!(!summary.contains("Facts for long-term memory"), "{summary}");
    assert!(!summary.contains("Helix"), "{summary}");
    // The watermark reached the end of the summarised messages.
    let to: u64 = summary
        .trim_start_matches("[summary of messages #")
        .split_once("..#")
        .and_then(|(_, rest)| rest.split_once(']'))
        .and_then(|(to, _)| to.parse().ok())
        .ok_or("no span in the summary")?;
    let saved = super::common::state_dir(dir.path(), &ws).join("hame/users/alice");
    let text = format!(
        "{}{}",
        fs::read_to_string(saved.join("facts.json"))?,
        fs::read_to_string(saved.join("facts.journal")).unwrap_or_default()
    );
    assert!(
        text.contains(&format!("\"flushed_through\":{to}")),
        "no watermark at #{to}: {text}"
    );
    Ok(())
}
