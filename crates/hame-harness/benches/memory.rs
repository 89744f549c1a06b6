//! Memory wiring figures: the cost of the after-call flush, and prompt tokens per turn over
//! a long session with and without compaction.
//!
//! The model is an instant in-process double that answers by request kind (flush, summary,
//! consolidation, chat), so the figures are the harness's own work (file I/O, lease, state
//! save, index), not model latency.
//!
//! `cargo bench -p hame-harness --bench memory` (`HAME_BENCH_TURNS`, default 300).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hame_core::{
    Message, Model, ModelError, ModelEvent, ModelInfo, ModelRequest, ModelStream, RuntimeContext,
    StopReason, Usage,
};
use hame_harness::{FlushPolicy, HarnessAgent, MemoryOptions};
use hame_memory::compaction::SUMMARY_SYSTEM_PROMPT;
use hame_memory::consolidate::CONSOLIDATION_SYSTEM_PROMPT;
use hame_memory::daily::FLUSH_SYSTEM_PROMPT;
use hame_memory::tokens::request_tokens;

/// Answers by request kind and records the chat requests' token counts.
#[derive(Debug, Default)]
struct Instant0 {
    chat_tokens: Mutex<Vec<u64>>,
    flushes: Mutex<usize>,
}

fn events(text: String) -> ModelStream {
    Box::pin(futures::stream::iter(
        [
            ModelEvent::TextDelta(text),
            ModelEvent::Usage(Usage {
                input_tokens: 10,
                output_tokens: 5,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            }),
            ModelEvent::Stop(StopReason::EndTurn),
        ]
        .into_iter()
        .map(Ok),
    ))
}

#[async_trait]
impl Model for Instant0 {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "bench".into(),
            model: "gpt-4o".into(),
            context_window: 128_000,
        }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let text = if request.system == FLUSH_SYSTEM_PROMPT {
            *self.flushes.lock().unwrap() += 1;
            "- The user is benchmarking the harness".to_owned()
        } else if request.system == SUMMARY_SYSTEM_PROMPT {
            "## Intent\nBenchmark.\n## Progress\nMany turns.\n## Artifacts\nNone\n## Next steps\nNone"
                .to_owned()
        } else if request.system == CONSOLIDATION_SYSTEM_PROMPT {
            "# Memory\n\n- The user is benchmarking the harness\n".to_owned()
        } else {
            let counter = hame_memory::counter_for_model("gpt-4o");
            let t = request_tokens(
                counter.as_ref(),
                &request.system,
                &request.messages,
                &request.tools,
            );
            self.chat_tokens.lock().unwrap().push(t);
            "Here is a reply of a typical length, with a few sentences that explain what was \
             done, what was found and what the next step is. It mentions a file path, a \
             number and a decision, as real replies do."
                .to_owned()
        };
        Ok(events(text))
    }
}

fn user_message(i: usize) -> String {
    format!(
        "Turn {i}: please look at the next part of the task, compare it with what we decided \
         before, and tell me whether the plan for component {i} still holds or needs a change."
    )
}

async fn session(turns: usize, options: MemoryOptions) -> (Vec<u64>, Duration, usize) {
    let ws = tempfile::tempdir().unwrap();
    let st = tempfile::tempdir().unwrap();
    let model = Arc::new(Instant0::default());
    let agent = HarnessAgent::builder()
        .model(model.clone())
        .workspace(ws.path())
        .state_store(Arc::new(hame_state::JsonStore::open(st.path()).unwrap()))
        .memory(options)
        .build()
        .unwrap();
    let ctx = RuntimeContext::new("bench").with_user("u");
    let started = Instant::now();
    for i in 0..turns {
        agent
            .call(Message::user(user_message(i)), &ctx)
            .await
            .unwrap();
        assert!(agent.wait_background(Duration::from_secs(30)).await);
    }
    let spent = started.elapsed();
    let tokens = model.chat_tokens.lock().unwrap().clone();
    let flushes = *model.flushes.lock().unwrap();
    (tokens, spent, flushes)
}

fn summary(label: &str, tokens: &[u64]) {
    let n = tokens.len().max(1) as u64;
    let total: u64 = tokens.iter().sum();
    let max = tokens.iter().max().copied().unwrap_or(0);
    let last = tokens.last().copied().unwrap_or(0);
    println!(
        "{label:<34} mean {:>7} max {:>7} last {:>7} total {:>10} prompt tokens",
        total / n,
        max,
        last,
        total
    );
}

fn main() {
    let turns: usize = std::env::var("HAME_BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("hame-harness memory benchmark: {turns} turns, in-process instant model");
        // Flush cost per call: a flush after every call vs none.
        let calls = 100.min(turns);
        let every_call = MemoryOptions {
            flush_policy: FlushPolicy {
                after_call: true,
                min_new_messages: 1,
            },
            ..MemoryOptions::default()
        };
        let no_flush = MemoryOptions {
            flush_policy: FlushPolicy {
                after_call: false,
                min_new_messages: 1,
            },
            ..MemoryOptions::default()
        };
        let (_, with, flushes) = session(calls, every_call).await;
        let (_, without, _) = session(calls, no_flush).await;
        let per = |d: Duration| d.as_secs_f64() * 1e3 / calls as f64;
        println!(
            "flush after every call ({flushes} flushes): {:.2} ms/call; without: {:.2} ms/call; \
             flush cost {:.2} ms (off the reply path)",
            per(with),
            per(without),
            per(with) - per(without)
        );
        // Prompt tokens per turn with and without compaction.
        let (compacted, t1, _) = session(turns, MemoryOptions::default()).await;
        let (plain, t2, _) = session(turns, MemoryOptions::disabled()).await;
        summary("with compaction (default memory)", &compacted);
        summary("without compaction (memory off)", &plain);
        println!(
            "wall time: {:.1} s with memory, {:.1} s without",
            t1.as_secs_f64(),
            t2.as_secs_f64()
        );
    });
}
