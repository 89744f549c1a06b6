//! `bench-peer`: hame in the peer benchmark of `../shared/bench/peers/` (its README,
//! "Adding an implementation", is the contract). It builds one `HarnessAgent` with the
//! embedded defaults (local workspace, JSON state, SQLite memory index), runs `S` sessions
//! of `T` turns with the workload's exact user messages, and prints one
//! `BENCH_RESULT {json}` line.
//!
//! - `--mode inproc`: a Rust port of the workload's scripted model (`common/scripted.py`,
//!   `decide()`), in the process, no socket.
//! - `--mode http`: the OpenAI-compatible client against `--base-url` (the benchmark's fake
//!   server), `POST …/reset` before and `GET …/stats` after.
//!
//! `cargo xtask bench-peers` builds it with `--profile dist` (fat LTO, opt-level 3: the
//! build of the published figures) and runs it beside the peers. `BENCH_RESULT` carries the
//! optimisation level it was compiled at (`opt_level`), and a build below 3 says on stderr
//! that its figures are not comparable with the published ones.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use clap::Parser;
use hame::{
    HarnessAgent, Message, Model, ModelError, ModelEvent, ModelInfo, ModelRequest, ModelStream,
    RuntimeContext, StopReason, Usage,
};
use serde_json::{Value, json};

mod workload;

/// The allocator of the `hame` binary (ADR 0044), so that the figures are the product's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
struct Args {
    /// `inproc` (scripted model in the process) or `http` (the fake OpenAI server).
    #[arg(long, default_value = "inproc")]
    mode: String,
    /// The fake server, e.g. http://127.0.0.1:8000/v1 (http mode).
    #[arg(long, default_value = "")]
    base_url: String,
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    #[arg(long, default_value_t = 200)]
    turns: usize,
    #[arg(long)]
    workdir: PathBuf,
    /// The window every harness is told about.
    #[arg(long, default_value_t = 64_000)]
    context_window: u64,
    /// In-process only: a summary call asked for the facts section answers it (one fact),
    /// as a model that follows the instructions does. Off by default: the workload's
    /// scripted model answers every summary with the same text, without the section (hame
    /// then records the facts with a flush call of their own).
    #[arg(long)]
    facts_section: bool,
    /// The JSON state store writes plain journal lines instead of packed ones (ADR 0021),
    /// to compare the two in one build.
    #[arg(long)]
    plain_journal: bool,
    /// A spending limit, `SCOPE.LIMIT=N` as `hame run --budget` takes it (repeatable). The
    /// default sets one limit in each scope, high enough never to stop this workload, so
    /// that every model request is checked against a run, a session and a user-day budget
    /// (the issue #34 measurement: "with budgets on"); `--budget none` sets none.
    #[arg(long, default_values_t = DEFAULT_BUDGETS.map(String::from))]
    budget: Vec<String>,
}

/// The budgets of a benchmark run unless `--budget` says otherwise: dollars per run and
/// session, tokens per user-day (the scripted model is priced below).
const DEFAULT_BUDGETS: [&str; 3] = [
    "run.usd=10",
    "session.usd=1000",
    "user_day.tokens=100000000000",
];

/// The scripted model's price (USD per million tokens: input, output, cached input, cache
/// write), so that dollar budgets apply to it as to a priced provider model.
const BENCH_PRICE: hame::harness::cost::Price =
    hame::harness::cost::Price::new(1.0, 4.0, 0.1, 1.25);

/// Counters of the in-process model, as the fake server keeps them.
#[derive(Debug, Default)]
struct Stats {
    calls: AtomicU64,
    by_kind: Mutex<BTreeMap<String, u64>>,
    prompt_chars_max: AtomicU64,
    prompt_chars_last: AtomicU64,
}

impl Stats {
    fn record(&self, kind: &str, chars: u64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut k) = self.by_kind.lock() {
            *k.entry(kind.to_owned()).or_default() += 1;
        }
        if matches!(kind, "tool" | "final" | "final_lost") {
            self.prompt_chars_last.store(chars, Ordering::Relaxed);
            self.prompt_chars_max.fetch_max(chars, Ordering::Relaxed);
        }
    }

    /// hame's own split of the tool-less calls (the benchmark counts compactions and
    /// memory flushes alike as summaries when the last messages mention summarising).
    fn split(&self, request: &ModelRequest) {
        if !request.tools.is_empty() {
            return;
        }
        let what = if request.system == hame::memory::compaction::SUMMARY_SYSTEM_PROMPT {
            "hame_compaction"
        } else if request.system == hame::memory::daily::FLUSH_SYSTEM_PROMPT {
            "hame_flush"
        } else {
            "hame_other"
        };
        if let Ok(mut k) = self.by_kind.lock() {
            *k.entry(what.to_owned()).or_default() += 1;
        }
    }

    fn snapshot(&self) -> Value {
        let kinds = self.by_kind.lock().map(|k| k.clone()).unwrap_or_default();
        let mut v = json!({
            "calls": self.calls.load(Ordering::Relaxed),
            "prompt_chars_max": self.prompt_chars_max.load(Ordering::Relaxed),
            "prompt_chars_last": self.prompt_chars_last.load(Ordering::Relaxed),
            "model_time_s": 0.0,
        });
        for k in [
            "tool",
            "final",
            "final_lost",
            "summary",
            "aux",
            "forced",
            "hame_compaction",
            "hame_flush",
            "hame_other",
        ] {
            v[format!("n_{k}")] = json!(kinds.get(k).copied().unwrap_or(0));
        }
        v
    }
}

/// The workload's scripted model, in the process.
#[derive(Debug)]
struct Scripted {
    window: u64,
    /// Answer the facts section of a summary call asked for it (`--facts-section`).
    facts_section: bool,
    stats: Arc<Stats>,
    counter: AtomicU64,
    /// The encoded length of each tool schema seen, by the schema's address; the schema is
    /// kept so that the address is not reused (schemas live as long as the agent).
    schema_chars: Mutex<Vec<(Arc<Value>, usize)>>,
}

impl Scripted {
    fn schema_chars(&self, schema: &Arc<Value>) -> usize {
        let Ok(mut known) = self.schema_chars.lock() else {
            return schema.to_string().len();
        };
        if let Some((_, n)) = known.iter().find(|(s, _)| Arc::ptr_eq(s, schema)) {
            return *n;
        }
        let n = schema.to_string().len();
        if known.len() >= 1024 {
            // Schemas made per request: caching them would only grow.
            known.clear();
        }
        known.push((schema.clone(), n));
        n
    }
}

#[async_trait]
impl Model for Scripted {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "bench".into(),
            model: "bench-scripted".into(),
            context_window: self.window,
        }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        // As the fake server counts (messages and tool schemas), so that the usage reported
        // back (chars / 4, as the server reports it) drives compaction the same way.
        let chars = request.system.len()
            + request
                .messages
                .iter()
                .flat_map(|m| m.content.iter())
                .map(|b| match b {
                    hame::ContentBlock::Text { text } => text.len(),
                    hame::ContentBlock::ToolCall(c) => c.name.len() + c.arguments.len(),
                    hame::ContentBlock::ToolResult(r) => r.content.len(),
                    _ => 0,
                })
                .sum::<usize>()
            + request
                .tools
                .iter()
                .map(|t| t.name.len() + t.description.len() + self.schema_chars(&t.parameters))
                .sum::<usize>();
        let decision = workload::decide(&request);
        self.stats.record(decision.kind, chars as u64);
        self.stats.split(&request);
        let mut events = Vec::new();
        let stop = if decision.call.is_some() {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        match decision.call {
            Some((name, args)) => {
                let n = self.counter.fetch_add(1, Ordering::Relaxed);
                events.push(ModelEvent::ToolCallStart {
                    index: 0,
                    id: format!("call_{n}"),
                    name,
                });
                events.push(ModelEvent::ToolCallDelta {
                    index: 0,
                    arguments: args.to_string(),
                });
            }
            None => {
                let mut text = decision.text;
                let asked = || {
                    request.messages.last().is_some_and(|m| {
                        m.text_content()
                            .contains(&format!("`{}`", hame::memory::compaction::FACTS_HEADING))
                    })
                };
                if self.facts_section && request.tools.is_empty() && asked() {
                    text.push_str(
                        "\n\n## Facts for long-term memory\n- The user runs scripted benchmark \
                         turns over knowledge.md, notes and greps for Zephyr.",
                    );
                }
                events.push(ModelEvent::TextDelta(text));
            }
        }
        events.push(ModelEvent::Usage(Usage {
            input_tokens: (chars / 4) as u64,
            output_tokens: 20,
            cached_input_tokens: 0,
            cache_write_input_tokens: 0,
        }));
        events.push(ModelEvent::Stop(stop));
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

/// The HTTP model with hame's split of its tool-less calls counted on the way, and the
/// time each request spends with the model: from the request to the stream's last event
/// (the fake server's answer, the socket, and the client's parsing of the events).
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Model>,
    stats: Arc<Stats>,
    /// Nanoseconds spent waiting for the model, all requests.
    wait_ns: Arc<AtomicU64>,
}

#[async_trait]
impl Model for Counting {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        use futures::StreamExt as _;
        self.stats.split(&request);
        let t0 = Instant::now();
        let stream = self.inner.stream(request).await?;
        let wait = self.wait_ns.clone();
        let mut last = Some(t0);
        Ok(stream
            .chain(futures::stream::poll_fn(move |_| {
                if let Some(t0) = last.take() {
                    let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    wait.fetch_add(ns, Ordering::Relaxed);
                }
                std::task::Poll::Ready(None)
            }))
            .boxed())
    }
}

/// Peak RSS of this process (`VmHWM`), MB.
fn rss_peak_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// `RssAnon` of this process (heap, stacks: not the executable's mapped pages), kB.
fn rss_anon_kb() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
}

/// Samples [`rss_anon_kb`] every 10 ms on a thread of its own and keeps the largest value:
/// the peak of the memory the harness allocates. `VmHWM` also counts the executable's
/// mapped text pages, whose number depends on the binary file's page-cache state (the same
/// binary peaks ~1.4 MB higher right after it was copied), so it does not compare builds.
struct AnonPeak {
    stop: Arc<AtomicBool>,
    max_kb: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AnonPeak {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max_kb = Arc::new(AtomicU64::new(rss_anon_kb().unwrap_or(0)));
        let (s, m) = (stop.clone(), max_kb.clone());
        let thread = std::thread::Builder::new()
            .name("rss-sampler".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Some(kb) = rss_anon_kb() {
                        m.fetch_max(kb, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
            .ok();
        AnonPeak {
            stop,
            max_kb,
            thread,
        }
    }

    /// Stops sampling; the peak in MB.
    fn finish(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(kb) = rss_anon_kb() {
            self.max_kb.fetch_max(kb, Ordering::Relaxed);
        }
        self.max_kb.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

/// Bytes this process passed to `write` (all files, `/proc/self/io` `wchar`).
fn bytes_written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("wchar:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn rss_now_mb() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(f64::NAN, |pages| pages * 4096.0 / (1024.0 * 1024.0))
}

/// path → (size, mtime ns) of every file below `root`.
fn snapshot(root: &Path, out: &mut BTreeMap<PathBuf, (u64, u128)>) {
    let Ok(dir) = std::fs::read_dir(root) else {
        return;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Ok(md) = entry.metadata() else { continue };
        if md.is_dir() {
            snapshot(&path, out);
        } else {
            let mtime = md
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            out.insert(path, (md.len(), mtime));
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((p * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1);
    sorted[k]
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

async fn server_stats(http: &reqwest::Client, base: &str, reset: bool) -> anyhow::Result<Value> {
    let base = base.trim_end_matches('/').trim_end_matches("/v1");
    if reset {
        http.post(format!("{base}/reset"))
            .body("{}")
            .send()
            .await?
            .error_for_status()?;
        return Ok(Value::Null);
    }
    Ok(http
        .get(format!("{base}/stats"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The optimisation level this binary was compiled at (`build.rs`).
const OPT_LEVEL: &str = env!("HAME_BENCH_OPT_LEVEL");

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if OPT_LEVEL != "3" {
        eprintln!(
            "bench-peer: built at opt-level {OPT_LEVEL}; the published figures use \
             `cargo build --profile dist -p hame-bench` (opt-level 3, fat LTO)"
        );
    }
    let ws = args.workdir.join("ws");
    let state = args.workdir.join("state");
    workload::make_workspace(&ws).context("writing the workspace")?;
    std::fs::create_dir_all(&state)?;

    let build_started = Instant::now();
    let stats = Arc::new(Stats::default());
    let wait_ns = Arc::new(AtomicU64::new(0));
    let http = reqwest::Client::new();
    let model: Arc<dyn Model> = match args.mode.as_str() {
        "inproc" => Arc::new(Scripted {
            window: args.context_window,
            facts_section: args.facts_section,
            stats: stats.clone(),
            counter: AtomicU64::new(0),
            schema_chars: Mutex::new(Vec::new()),
        }),
        "http" => {
            let mut config = hame::model::OpenAiConfig::new("bench-model");
            config.base_url = args.base_url.clone();
            config.api_key = Some("bench".into());
            config.context_window = args.context_window;
            Arc::new(Counting {
                inner: Arc::new(hame::model::OpenAiModel::new(config)?),
                stats: stats.clone(),
                wait_ns: wait_ns.clone(),
            })
        }
        other => anyhow::bail!("unknown mode {other}"),
    };
    let mut budgets = hame::harness::cost::Budgets::default();
    for spec in args.budget.iter().filter(|b| b.as_str() != "none") {
        budgets.set(spec).map_err(anyhow::Error::msg)?;
    }
    let agent = HarnessAgent::builder()
        .name("bench")
        .model(model)
        .budgets(budgets)
        .prices(
            hame::harness::cost::Prices::default()
                .with("bench:", BENCH_PRICE)
                .with("bench-model", BENCH_PRICE),
        )
        .workspace(&ws)
        .state_store(Arc::new(
            hame::state::JsonStore::open(&state)?.with_packed_journal(!args.plain_journal),
        ))
        .build()?;
    let build_s = build_started.elapsed().as_secs_f64();

    if args.mode == "http" {
        server_stats(&http, &args.base_url, true).await?;
    }
    let mut before = BTreeMap::new();
    snapshot(&args.workdir, &mut before);
    let rss_before = rss_now_mb();
    let anon_peak = AnonPeak::start();
    let written_before = bytes_written();
    let (s, t) = (args.sessions, args.turns);
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    // Sequential runs record the request size after each turn, as the Python workload does
    // (`prompt_chars_trace`), outside the timed part of the turn.
    let trace = Arc::new(Mutex::new(Vec::<u64>::new()));
    let runs = (0..s).map(|i| {
        let agent = agent.clone();
        let errors = errors.clone();
        let (trace, stats, http, mode, base, wait_ns) = (
            trace.clone(),
            stats.clone(),
            http.clone(),
            args.mode.clone(),
            args.base_url.clone(),
            wait_ns.clone(),
        );
        async move {
            let sid = (s > 1).then(|| format!("s{i}"));
            let ctx = RuntimeContext::new(sid.clone().unwrap_or_else(|| "s0".into()));
            let mut lat = Vec::with_capacity(t);
            let mut harness = Vec::with_capacity(t);
            for turn in 0..t {
                let text = workload::user_message(turn, "/", sid.as_deref());
                let waited = wait_ns.load(Ordering::Relaxed);
                let t0 = Instant::now();
                if let Err(e) = agent.call(Message::user(text), &ctx).await
                    && let Ok(mut errs) = errors.lock()
                {
                    errs.push(e.to_string().chars().take(300).collect());
                }
                let took = t0.elapsed().as_secs_f64();
                lat.push(took);
                // One session: the counter moved only for this turn's requests.
                let waited = wait_ns.load(Ordering::Relaxed).saturating_sub(waited);
                harness.push(took - waited as f64 / 1e9);
                if s == 1 {
                    let st = if mode == "http" {
                        server_stats(&http, &base, false)
                            .await
                            .unwrap_or(Value::Null)
                    } else {
                        stats.snapshot()
                    };
                    if let (Some(c), Ok(mut t)) = (
                        st.get("prompt_chars_last").and_then(Value::as_u64),
                        trace.lock(),
                    ) {
                        t.push(c);
                    }
                }
            }
            (lat, harness)
        }
    });
    let handles: Vec<_> = runs.map(tokio::spawn).collect();
    let mut lat = Vec::new();
    let mut harness = Vec::new();
    for h in handles {
        let (l, o) = h.await?;
        lat.extend(l);
        harness.extend(o);
    }
    let wall = started.elapsed().as_secs_f64();
    let rss_anon_peak = anon_peak.finish();
    agent.wait_background(Duration::from_secs(60)).await;
    let written = bytes_written().saturating_sub(written_before);
    let mut after = BTreeMap::new();
    snapshot(&args.workdir, &mut after);
    let st = if args.mode == "http" {
        server_stats(&http, &args.base_url, false).await?
    } else {
        stats.snapshot()
    };

    let new: Vec<_> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    let changed: Vec<_> = after
        .iter()
        .filter(|(p, v)| before.get(*p).is_some_and(|b| b != *v))
        .map(|(p, _)| p)
        .collect();
    let bytes: u64 = new.iter().chain(changed.iter()).map(|p| after[*p].0).sum();
    let notes = std::fs::read_dir(&ws)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("note-"))
        .count();
    let mut sorted = lat.clone();
    sorted.sort_by(f64::total_cmp);
    harness.sort_by(f64::total_cmp);
    let model_wait_s = wait_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let errors = errors.lock().map(|e| e.clone()).unwrap_or_default();
    let own = stats.snapshot();
    let n = |k: &str| {
        st.get(k)
            .or_else(|| own.get(k))
            .cloned()
            .unwrap_or(json!(0))
    };
    let result = json!({
        "peer": "hame",
        "version": env!("CARGO_PKG_VERSION"),
        "opt_level": OPT_LEVEL,
        "mode": args.mode,
        "sessions": s,
        "turns": t,
        "concurrency": if s > 1 { "tokio" } else { "none" },
        "import_s": 0.0,
        "build_s": round(build_s, 4),
        "wall_s": round(wall, 4),
        "turns_per_s": if wall > 0.0 { round((s * t) as f64 / wall, 2) } else { 0.0 },
        "turn_ms_p50": round(pct(&sorted, 0.5) * 1000.0, 3),
        "turn_ms_p95": round(pct(&sorted, 0.95) * 1000.0, 3),
        "turn_ms_max": round(sorted.last().copied().unwrap_or(f64::NAN) * 1000.0, 3),
        // http mode: the time requests spent with the fake server (its answer, the socket,
        // the client's parsing), all turns, and a turn's time without it (one session only:
        // with several, the requests of other sessions overlap a turn's).
        "model_wait_s": round(model_wait_s, 4),
        "harness_turn_ms_p50": if s == 1 && args.mode == "http" { Some(round(pct(&harness, 0.5) * 1000.0, 3)) } else { None },
        "first_turn_ms": if s == 1 { lat.first().map(|x| round(x * 1000.0, 3)) } else { None },
        "compactions": n("n_summary"),
        "prompt_chars_max": n("prompt_chars_max"),
        "prompt_chars_last": n("prompt_chars_last"),
        "model_calls": n("calls"),
        "model_calls_by_kind": {
            "tool": n("n_tool"), "final": n("n_final"), "final_lost": n("n_final_lost"),
            "summary": n("n_summary"), "aux": n("n_aux"), "forced": n("n_forced"),
        },
        "rss_after_build_mb": round(rss_before, 1),
        "rss_peak_mb": round(rss_peak_mb(), 1),
        "rss_anon_peak_mb": round(rss_anon_peak, 1),
        "notes_written": notes,
        "notes_expected": s * (0..t).filter(|t| t % 3 == 1).count(),
        "errors": errors.len(),
        "error_samples": errors.iter().take(3).collect::<Vec<_>>(),
        "files_new": new.len(),
        "files_changed": changed.len(),
        "bytes_on_disk": after.values().map(|v| v.0).sum::<u64>(),
        "bytes_new_or_changed": bytes,
        "bytes_written_syscalls": written,
        "session_log_bytes": after
            .iter()
            .filter(|(p, _)| p.to_string_lossy().ends_with(".log.jsonl"))
            .map(|(_, v)| v.0)
            .sum::<u64>(),
        "prompt_chars_trace": trace
            .lock()
            .map(|t| {
                let step = (t.len() / 20).max(1);
                t.iter().step_by(step).copied().collect::<Vec<_>>()
            })
            .unwrap_or_default(),
        "hame_compactions": n("n_hame_compaction"),
        "hame_memory_flushes": n("n_hame_flush"),
        "hame_other_toolless": n("n_hame_other"),
    });
    println!("BENCH_RESULT {result}");
    Ok(())
}
