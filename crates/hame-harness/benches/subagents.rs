//! Subagent costs, excluding the model (an instant in-process model that routes by the
//! system prompt: the parent spawns, the child answers).
//!
//! 1. Harness overhead of one sync spawn: the parent's `agent_spawn` tool call, measured
//!    from the tool's start to its result (the child's whole call: declarations read
//!    through the workspace handle, task record written three times, the child's lease,
//!    state load/save and session log), minus the time inside the model.
//! 2. 100 background children from one step, concurrency bound 8: wall time, the peak of
//!    children running at once, and what is left afterwards (live tasks, RSS).
//!
//! `cargo bench -p hame-harness --bench subagents` prints the figures.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hame_core::test_support::Reply;
use hame_core::{
    Message, Model, ModelError, ModelInfo, ModelRequest, ModelStream, Role, RuntimeContext,
    ToolCall,
};
use hame_harness::HarnessAgent;

/// Parent: `children` spawns in one step, then a final answer. Child: one answer.
#[derive(Debug)]
struct Router {
    children: usize,
    background: bool,
    spent: Arc<Mutex<Duration>>,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

#[async_trait]
impl Model for Router {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "bench".into(),
            model: "bench".into(),
            context_window: 128_000,
        }
    }
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let started = Instant::now();
        let child = request.system.contains("## Subagent context");
        let record = child;
        let reply = if child {
            let n = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(n, Ordering::SeqCst);
            if self.background {
                // A child that takes a little while, so the bound matters.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.running.fetch_sub(1, Ordering::SeqCst);
            Reply::text("child report")
        } else if request
            .messages
            .last()
            .is_some_and(|m| m.text_content() == "plain")
        {
            Reply::text("plain answer")
        } else if request.messages.last().is_some_and(|m| {
            m.role == Role::User && !m.text_content().contains("system-notification")
        }) {
            let calls: Vec<ToolCall> = (0..self.children)
                .map(|i| ToolCall {
                    id: format!("c{i}"),
                    name: "agent_spawn".into(),
                    arguments: serde_json::json!({
                        "agent_id": "general-purpose",
                        "task": format!("job {i}"),
                        "background": self.background,
                    })
                    .to_string(),
                })
                .collect();
            Reply::tools(&calls)
        } else {
            Reply::text("parent done")
        };
        if record {
            *self.spent.lock().unwrap() += started.elapsed();
        }
        match reply {
            Reply::Events(ev) => Ok(Box::pin(futures::stream::iter(ev.into_iter().map(Ok)))),
            Reply::Fail(e) => Err(e),
        }
    }
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn make_agent(dir: &std::path::Path, model: Router, concurrency: usize) -> HarnessAgent {
    HarnessAgent::builder()
        .model(Arc::new(model))
        .workspace(dir.join("ws"))
        .state_store(Arc::new(hame_state::InMemoryStore::new()))
        .memory(hame_harness::memory::MemoryOptions::disabled())
        .subagent_options(hame_subagent::SubagentOptions {
            max_concurrency: concurrency,
            ..hame_subagent::SubagentOptions::default()
        })
        .build()
        .unwrap()
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// Spawn span minus the child's model time, and the same one-request call made directly,
/// interleaved so that both see the same disk.
async fn spawn_vs_call(dir: &std::path::Path, label: &str) {
    let spent = Arc::new(Mutex::new(Duration::ZERO));
    let model = Router {
        children: 1,
        background: false,
        spent: spent.clone(),
        running: Arc::default(),
        peak: Arc::default(),
    };
    let agent = make_agent(dir, model, 8);
    let (mut spawns, mut plain) = (Vec::new(), Vec::new());
    for i in 0..220 {
        let ctx = RuntimeContext::new(format!("s{i}"));
        *spent.lock().unwrap() = Duration::ZERO;
        let out = agent.call(Message::user("go"), &ctx).await.unwrap();
        assert_eq!(out.reply.text_content(), "parent done");
        // The child's part, from its task record: created_at .. updated_at of the
        // completed record, minus the child's model time.
        let tasks = agent.tasks(&ctx).await.unwrap();
        let r = &tasks[0];
        assert_eq!(r.status, hame_subagent::TaskStatus::Completed);
        let child_us = (r.updated_at - r.created_at)
            .num_microseconds()
            .unwrap_or(0) as f64;
        let model_us = spent.lock().unwrap().as_micros() as f64;
        let ctx = RuntimeContext::new(format!("p{i}"));
        let started = Instant::now();
        agent.call(Message::user("plain"), &ctx).await.unwrap();
        let call_ms = started.elapsed().as_secs_f64() * 1000.0;
        if i >= 20 {
            spawns.push((child_us - model_us).max(0.0) / 1000.0);
            plain.push(call_ms);
        }
    }
    let (s50, c50) = (
        percentile(spawns.clone(), 0.5),
        percentile(plain.clone(), 0.5),
    );
    println!(
        "{label}: sync spawn (record created .. completed, minus the model) p50 {s50:.3} ms p90 {:.3} ms; the same call made directly p50 {c50:.3} ms p90 {:.3} ms; added by the spawn {:.3} ms (n=200)",
        percentile(spawns, 0.9),
        percentile(plain, 0.9),
        s50 - c50
    );
}

#[tokio::main]
async fn main() {
    // 1. Sync spawn overhead: on tmpfs (no fsync: the harness's own work) and on disk.
    if std::path::Path::new("/dev/shm").is_dir() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        spawn_vs_call(dir.path(), "tmpfs").await;
    }
    let dir = tempfile::tempdir().unwrap();
    spawn_vs_call(dir.path(), "disk").await;

    // 2. 100 background children from one step.
    let dir = tempfile::tempdir().unwrap();
    let peak = Arc::new(AtomicUsize::new(0));
    let model = Router {
        children: 100,
        background: true,
        spent: Arc::default(),
        running: Arc::default(),
        peak: peak.clone(),
    };
    let agent = make_agent(dir.path(), model, 8);
    let rss_before = rss_kb();
    let ctx = RuntimeContext::new("fan-out");
    let started = Instant::now();
    agent.call(Message::user("go"), &ctx).await.unwrap();
    let left = agent.wait_tasks(Duration::from_secs(120)).await;
    let wall = started.elapsed();
    let tasks = agent.tasks(&ctx).await.unwrap();
    let completed = tasks
        .iter()
        .filter(|t| t.status == hame_subagent::TaskStatus::Completed)
        .count();
    // The next call delivers all 100 results (once) and frees their entries.
    agent.call(Message::user("results?"), &ctx).await.unwrap();
    let state = agent.state(&ctx).await.unwrap().unwrap();
    let pushed = state
        .messages
        .iter()
        .map(|m| m.text_content().matches("Background task task-").count())
        .sum::<usize>();
    println!(
        "100 background children, bound 8: {:.0} ms wall, peak running {}, completed {completed}, still running {left}, results pushed {pushed}, tracked tasks after delivery {}, RSS {} -> {} KiB",
        wall.as_secs_f64() * 1000.0,
        peak.load(Ordering::SeqCst),
        agent.subagents().tracked(),
        rss_before,
        rss_kb()
    );
}
