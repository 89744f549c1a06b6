//! Harness time per reasoning step, excluding the model.
//!
//! Runs calls of `STEPS` steps (each step asks for one cheap tool call; the last answers)
//! through a full `HarnessAgent` (workspace context rebuilt from disk every step, session
//! log appended per message, state loaded and saved per call) and reports the time spent
//! outside the model: total wall time minus the time spent inside the model's stream.
//!
//! Two models: an instant in-process double, and the real OpenAI client against the
//! scripted server on 127.0.0.1 (loopback HTTP, SSE).
//!
//! `cargo bench -p hame-harness --bench step` (release) prints its figures. For instruction
//! counts (`valgrind --tool=callgrind` on the bench binary) run one case alone:
//! `HAME_STEP_CASE=ram|disk|redis` runs only that storage case (no parts, no scripted
//! server), `HAME_STEP_RECORDS=with|without` only one side of the comparison,
//! `HAME_STEP_CALLS=N` N calls instead of 30 (two runs with different N give the
//! instructions of N calls without the set-up).
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use hame_core::test_support::{Reply, ScriptedModel};
use hame_core::{
    Message, Model, ModelError, ModelInfo, ModelRequest, ModelStream, RuntimeContext, ToolCall,
};
use hame_harness::HarnessAgent;

const STEPS: usize = 20;
const CALLS: usize = 30;

/// Calls per measured run: `HAME_STEP_CALLS`, default [`CALLS`].
fn calls() -> usize {
    std::env::var("HAME_STEP_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CALLS)
}

/// Wraps a model and accumulates the time spent inside it (request + stream).
#[derive(Debug)]
struct Timed<M> {
    inner: M,
    spent: Arc<Mutex<Duration>>,
}

#[async_trait]
impl<M: Model> Model for Timed<M> {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let started = Instant::now();
        let mut s = self.inner.stream(request).await?;
        let mut events = Vec::new();
        while let Some(ev) = s.next().await {
            events.push(ev);
        }
        *self.spent.lock().unwrap() += started.elapsed();
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

/// Where the agent's files are kept.
#[derive(Debug, Clone)]
enum Storage {
    /// Local disk: session log appends and state saves are fsynced.
    Durable,
    /// Storage in memory: what is left is the harness's own CPU time.
    Ram,
    /// Store mode on a real Redis (`HAME_TEST_REDIS_URL`), with 20 skills and 10 subagent
    /// specs in the workspace (issue #34).
    Redis(String),
}

/// Sets the modification time of every file below `dir` to a minute ago (files that did
/// not change lately, as a workspace's mostly are).
fn backdate(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            backdate(&path);
        } else {
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
                .unwrap();
        }
    }
}

fn workspace_with(skills: bool) -> tempfile::TempDir {
    let dir = workspace();
    let ws = dir.path();
    if skills {
        for i in 0..20 {
            std::fs::create_dir_all(ws.join(format!("skills/skill-{i}"))).unwrap();
            std::fs::write(
                ws.join(format!("skills/skill-{i}/SKILL.md")),
                format!("---\ndescription: Skill {i}. Use when asked for {i}.\n---\n# Skill {i}\nSteps.\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(ws.join("subagents")).unwrap();
        for i in 0..10 {
            std::fs::write(
                ws.join(format!("subagents/agent-{i}.md")),
                format!("---\ndescription: Reviewer {i}\nmax_iterations: 4\n---\nYou review.\n"),
            )
            .unwrap();
        }
    }
    backdate(ws);
    dir
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    std::fs::create_dir_all(ws.join("knowledge/faq")).unwrap();
    std::fs::write(
        ws.join("AGENTS.md"),
        "# Persona\nYou are a careful assistant.\n".repeat(40),
    )
    .unwrap();
    std::fs::write(
        ws.join("MEMORY.md"),
        "- a remembered fact about the user\n".repeat(300),
    )
    .unwrap();
    std::fs::write(
        ws.join("knowledge/KNOWLEDGE.md"),
        "Product catalogue.\n".repeat(50),
    )
    .unwrap();
    for i in 0..20 {
        std::fs::write(ws.join(format!("knowledge/faq/q{i}.md")), "answer").unwrap();
    }
    dir
}

fn tool_step(i: usize) -> ToolCall {
    ToolCall {
        id: format!("c{i}"),
        name: "list_files".into(),
        arguments: r#"{"path":"knowledge"}"#.into(),
    }
}

async fn measure(
    label: &str,
    make_model: &dyn Fn() -> Arc<dyn Model>,
    spent: Arc<Mutex<Duration>>,
    storage: Storage,
    records: bool,
) -> f64 {
    let ws = workspace_with(matches!(storage, Storage::Redis(_)));
    let mut counting = None;
    let state = tempfile::tempdir().unwrap();
    // Memory on (compaction checks, offloading, memory tools) but no after-call flush: the
    // flush is background work that asks the model, which would consume the script.
    let mut memory = hame_harness::memory::MemoryOptions::default();
    memory.flush_policy.after_call = false;
    let builder = HarnessAgent::builder()
        .model(make_model())
        .workspace(ws.path())
        .memory(memory)
        .action_records(records);
    let agent = match &storage {
        Storage::Durable => {
            builder.state_store(Arc::new(hame_state::JsonStore::open(state.path()).unwrap()))
        }
        Storage::Ram => builder
            .state_store(Arc::new(hame_state::InMemoryStore::new()))
            .filesystem(hame_harness::FilesystemMode::SharedStore {
                store: Arc::new(hame_fs::InMemoryFs::new()),
            })
            .allow_local_state_with_shared_filesystem(true),
        Storage::Redis(url) => {
            let ns = format!("bench-{}", std::process::id());
            let redis =
                hame_fs_remote::RedisFs::connect(url, &ns, hame_fs_remote::RedisOptions::default())
                    .await
                    .unwrap();
            let c = hame_fs::CountingFs::new(Arc::new(redis));
            counting = Some(c.clone());
            builder
                .state_store(Arc::new(hame_state::InMemoryStore::new()))
                .filesystem(hame_harness::FilesystemMode::SharedStore { store: Arc::new(c) })
                .allow_local_state_with_shared_filesystem(true)
        }
    }
    .build()
    .unwrap();
    // Warm up once.
    agent
        .call(Message::user("warm"), &RuntimeContext::new("warm"))
        .await
        .unwrap();
    *spent.lock().unwrap() = Duration::ZERO;
    if let Some(c) = &counting {
        c.reset();
    }
    let calls = calls();
    let started = Instant::now();
    for c in 0..calls {
        let ctx = RuntimeContext::new(format!("s{c}")).with_user("bench");
        let out = agent.call(Message::user("go"), &ctx).await.unwrap();
        assert_eq!(out.iterations, STEPS);
    }
    let total = started.elapsed();
    let model = *spent.lock().unwrap();
    let harness = total.saturating_sub(model);
    let steps = (calls * STEPS).max(1) as f64;
    let label = format!("{label}{}", if records { "" } else { " (no records)" });
    println!(
        "{label:<42} steps {:>5}  total {:>8.1} ms  model {:>8.1} ms  harness {:>7.1} ms  harness/step {:>7.3} ms",
        calls * STEPS,
        total.as_secs_f64() * 1e3,
        model.as_secs_f64() * 1e3,
        harness.as_secs_f64() * 1e3,
        harness.as_secs_f64() * 1e3 / steps,
    );
    if let Some(c) = counting {
        let counts = c.counts();
        let mut ops: Vec<String> = counts
            .ops
            .iter()
            .map(|(k, v)| format!("{k}={:.1}", *v as f64 / steps))
            .collect();
        ops.sort();
        println!(
            "{:<42} store operations/step {:.1} ({})",
            "",
            counts.total() as f64 / steps,
            ops.join(", ")
        );
    }
    harness.as_secs_f64() * 1e3 / steps
}

fn script() -> Vec<Reply> {
    let mut replies = Vec::new();
    for _ in 0..=calls() {
        for i in 0..STEPS - 1 {
            replies.push(Reply::tools(&[tool_step(i)]));
        }
        replies.push(Reply::text("done"));
    }
    replies
}

/// The parts of a step measured alone: prompt assembly and one session-log append; returns
/// what the action observation and the context manifest of one step cost (ms).
async fn components() -> f64 {
    let ws = workspace();
    let state = tempfile::tempdir().unwrap();
    let agent = HarnessAgent::builder()
        .model(Arc::new(ScriptedModel::new([])))
        .workspace(ws.path())
        .state_store(Arc::new(hame_state::JsonStore::open(state.path()).unwrap()))
        .build()
        .unwrap();
    let ctx = RuntimeContext::new("parts").with_user("bench");
    let n = 500;

    let handle = agent.workspace_for(&ctx).unwrap();
    let events = hame_core::EventSink::none();
    let context = hame_harness::WorkspaceContext::new(
        hame_harness::ContextOptions {
            agent: "hame".into(),
            memory_budget_tokens: 8000,
            additional_context_files: Vec::new(),
        },
        hame_harness::TokenCount::estimate(),
    );
    let started = Instant::now();
    let mut len = 0;
    for _ in 0..n {
        let parts = context.parts("base", &handle, &events).await;
        len = hame_harness::prompt::render(&parts).len();
    }
    let per = started.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!("prompt assembly (reads AGENTS.md, MEMORY.md, knowledge/; {len} chars)  {per:.3} ms");

    // Where prompt assembly spends its time.
    let fs2 = agent.filesystem_for(&ctx).unwrap();
    for path in [
        "AGENTS.md",
        "MEMORY.md",
        "knowledge/KNOWLEDGE.md",
        "bench/AGENTS.md",
    ] {
        let p = hame_fs::FsPath::parse(path).unwrap();
        let started = Instant::now();
        for _ in 0..n {
            let _ = fs2.read_bytes(&p).await;
        }
        let per = started.elapsed().as_secs_f64() * 1e3 / n as f64;
        println!("  read {path:<28} through the tenant view   {per:.3} ms");
    }
    let mut g = hame_fs::GlobRequest::new("**/*");
    g.path = hame_fs::FsPath::parse("knowledge").unwrap();
    let started = Instant::now();
    for _ in 0..n {
        let _ = fs2.glob(&g).await;
    }
    let per = started.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!("  glob knowledge/**/* through the tenant view          {per:.3} ms");

    let log = hame_session::SessionLog::with_options(
        handle.records().clone(),
        "hame",
        hame_session::SessionLogOptions {
            update_index: false,
            ..Default::default()
        },
    )
    .unwrap();
    let msg = Message::assistant("a typical assistant message of a few dozen words ".repeat(4));
    let started = Instant::now();
    for i in 0..n {
        log.append_messages("parts", &format!("c{i}"), std::slice::from_ref(&msg))
            .await
            .unwrap();
    }
    let per = started.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!("session-log append of one message (fdatasync)                {per:.3} ms");

    // Issue #33: what a step adds — one observation appended (unflushed; one flush per
    // call) and the manifest of the step's request (sections, hashes, tokens).
    let obs = hame_core::Observation {
        id: "ob-0123456789abcdef".into(),
        call_id: "c1".into(),
        attempt: 1,
        tool: "list_files".into(),
        args_hash: hame_harness::evidence::args_hash(r#"{"path":"knowledge"}"#),
        step: 3,
        started: chrono::Utc::now(),
        ended: chrono::Utc::now(),
        duration_ms: 1,
        outcome: hame_core::ObservationOutcome::Ok,
        code: None,
        idempotency_key: None,
        facts: serde_json::Map::new(),
    };
    let started = Instant::now();
    for _ in 0..n {
        log.append_observations(
            "parts",
            std::slice::from_ref(&obs),
            hame_fs::AppendOptions::atomic(),
        )
        .await
        .unwrap();
    }
    let observation = started.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!("observation append (unflushed)                                {observation:.3} ms");
    let parts = context.parts("base", &handle, &events).await;
    let mut messages = vec![Message::user("go")];
    for i in 0..STEPS - 1 {
        messages.push(Message {
            role: hame_core::Role::Assistant,
            content: vec![hame_core::ContentBlock::ToolCall(tool_step(i))].into(),
            usage: None,
        });
        messages.push(Message::tool_results(vec![hame_core::ToolResult {
            id: format!("c{i}"),
            content: "faq/\nKNOWLEDGE.md\n".into(),
            is_error: false,
            code: None,
        }]));
    }
    let request = hame_core::ModelRequest {
        system: hame_harness::prompt::render(&parts),
        messages,
        tools: agent.agent_loop().tools().specs(),
        params: Default::default(),
        cache_key: None,
    };
    let counter = hame_memory::counter_for_model("bench");
    // One memo across requests, as the layer keeps it.
    let memo = hame_harness::manifest::SectionMemo::default();
    let started = Instant::now();
    let mut sections = 0;
    for _ in 0..n {
        let mut m = hame_harness::manifest::manifest_with(&request, counter.as_ref(), &memo);
        hame_harness::manifest::attribute(&mut m, 5000);
        sections = m.len();
    }
    let manifest = started.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!(
        "context manifest of a {}-message request ({sections} sections)    {manifest:.3} ms",
        request.messages.len()
    );
    observation + manifest
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // One case alone (for instruction counts): no parts, no scripted server.
    let only = std::env::var("HAME_STEP_CASE").ok();
    let sides: Vec<bool> = match std::env::var("HAME_STEP_RECORDS").as_deref() {
        Ok("with") => vec![true],
        Ok("without") => vec![false],
        _ => vec![true, false],
    };
    rt.block_on(async {
        let added = match only {
            Some(_) => f64::NAN,
            None => components().await,
        };
        println!(
            "hame-harness step benchmark: {} calls x {STEPS} steps (19 tool calls + answer)",
            calls()
        );
        // Issue #33: the same calls with and without the observations and context
        // manifests (`HarnessAgentBuilder::action_records`), alternately, `HAME_STEP_REPEAT`
        // times (default 3); the medians are compared.
        let repeat: usize = std::env::var("HAME_STEP_REPEAT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3)
            .max(1);
        let mut per_step = Vec::new();
        let mut cases = vec![
            ("instant model, local disk", Storage::Durable),
            ("instant model, storage in RAM", Storage::Ram),
        ];
        match std::env::var("HAME_TEST_REDIS_URL") {
            Ok(url) => cases.push(("instant model, Redis store", Storage::Redis(url))),
            Err(_) => println!("(HAME_TEST_REDIS_URL is not set: no Redis store case)"),
        }
        if let Some(only) = &only {
            cases.retain(|(_, s)| {
                matches!(
                    (only.as_str(), s),
                    ("disk", Storage::Durable) | ("ram", Storage::Ram) | ("redis", Storage::Redis(_))
                )
            });
        }
        for (label, storage) in cases {
            let (mut with, mut without) = (Vec::new(), Vec::new());
            for _ in 0..repeat {
                for &records in &sides {
                    let spent = Arc::new(Mutex::new(Duration::ZERO));
                    let s = spent.clone();
                    let harness = measure(
                        label,
                        &move || {
                            Arc::new(Timed {
                                inner: ScriptedModel::new(script()),
                                spent: s.clone(),
                            }) as Arc<dyn Model>
                        },
                        spent,
                        storage.clone(),
                        records,
                    )
                    .await;
                    if records { &mut with } else { &mut without }.push(harness);
                }
            }
            per_step.push((label, median(&mut with), median(&mut without)));
        }
        println!("load average: {}", load_average());
        for (label, with, without) in per_step {
            println!(
                "observations + manifest: harness/step {with:.3} ms with, {without:.3} ms without (medians of {repeat}) = {:+.1} % ({label}); parts measured alone: {added:.3} ms = {:.1} %",
                (with - without) / without * 100.0,
                added / without * 100.0
            );
        }
        if only.is_some() {
            return;
        }

        let server = hame_test_support::ScriptedServer::start().await.unwrap();
        for _ in 0..=calls() {
            for i in 0..STEPS - 1 {
                server.push(hame_test_support::ScriptStep::tool_call(
                    format!("c{i}"),
                    "list_files",
                    serde_json::json!({"path": "knowledge"}),
                ));
            }
            server.push(hame_test_support::ScriptStep::text("done"));
        }
        let base = server.base_url();
        let env = move |k: &str| (k == "OPENAI_BASE_URL").then(|| base.clone());
        let http = hame_model::open("openai:bench", &env).unwrap();
        let spent = Arc::new(Mutex::new(Duration::ZERO));
        let s = spent.clone();
        measure(
            "scripted server, local disk",
            &move || {
                Arc::new(Timed {
                    inner: http.clone(),
                    spent: s.clone(),
                }) as Arc<dyn Model>
            },
            spent,
            Storage::Durable,
            true,
        )
        .await;
    });
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), to publish with the figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
