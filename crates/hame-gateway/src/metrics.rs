//! `/metrics` in the Prometheus text format, counted from the calls' events.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the model latency histogram, in seconds.
const MODEL_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Turns by outcome (`finished`, `suspended`, `failed`).
    turns: Mutex<BTreeMap<&'static str, u64>>,
    /// Turn wall time, sum in microseconds, and count.
    turn_micros: AtomicU64,
    turn_count: AtomicU64,
    steps: AtomicU64,
    /// Tool calls by (name, outcome).
    tools: Mutex<BTreeMap<(String, &'static str), u64>>,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    /// Model request latency: counts per bucket of [`MODEL_BUCKETS`] (cumulative when
    /// rendered), the sum in milliseconds and the count.
    model_buckets: [AtomicU64; MODEL_BUCKETS.len()],
    model_millis: AtomicU64,
    model_count: AtomicU64,
    /// Refused requests by reason (`queue_full`, `unauthorized`, ...).
    refused: Mutex<BTreeMap<&'static str, u64>>,
}

/// Gauges read when `/metrics` is asked.
#[derive(Debug)]
pub(crate) struct Gauges {
    pub(crate) queue_depth: usize,
    pub(crate) sessions: usize,
    pub(crate) in_flight: usize,
}

impl Metrics {
    pub(crate) fn turn(&self, outcome: &'static str, micros: u64) {
        if let Ok(mut t) = self.turns.lock() {
            *t.entry(outcome).or_default() += 1;
        }
        self.turn_micros.fetch_add(micros, Ordering::Relaxed);
        self.turn_count.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn event(&self, ev: &hame::AgentEvent) {
        match ev {
            hame::AgentEvent::StepStarted { .. } => {
                self.steps.fetch_add(1, Ordering::Relaxed);
            }
            hame::AgentEvent::ToolFinished { name, is_error, .. } => {
                if let Ok(mut t) = self.tools.lock() {
                    let outcome = if *is_error { "error" } else { "ok" };
                    *t.entry((name.clone(), outcome)).or_default() += 1;
                }
            }
            hame::AgentEvent::ModelResponded { duration_ms } => {
                let secs = *duration_ms as f64 / 1e3;
                if let Some(i) = MODEL_BUCKETS.iter().position(|b| secs <= *b) {
                    self.model_buckets[i].fetch_add(1, Ordering::Relaxed);
                }
                self.model_millis.fetch_add(*duration_ms, Ordering::Relaxed);
                self.model_count.fetch_add(1, Ordering::Relaxed);
            }
            hame::AgentEvent::Usage { usage } => {
                self.input_tokens
                    .fetch_add(usage.input_tokens, Ordering::Relaxed);
                self.output_tokens
                    .fetch_add(usage.output_tokens, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    pub(crate) fn refused(&self, reason: &'static str) {
        if let Ok(mut r) = self.refused.lock() {
            *r.entry(reason).or_default() += 1;
        }
    }

    pub(crate) fn render(&self, agent: &str, g: &Gauges) -> String {
        let mut out = String::new();
        let a = escape(agent);
        let _ = writeln!(
            out,
            "# HELP hame_turns_total Turns (calls and resumes) by outcome."
        );
        let _ = writeln!(out, "# TYPE hame_turns_total counter");
        if let Ok(t) = self.turns.lock() {
            for (outcome, n) in t.iter() {
                let _ = writeln!(
                    out,
                    "hame_turns_total{{agent=\"{a}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        let _ = writeln!(out, "# HELP hame_turn_seconds Wall time of turns.");
        let _ = writeln!(out, "# TYPE hame_turn_seconds summary");
        let _ = writeln!(
            out,
            "hame_turn_seconds_sum{{agent=\"{a}\"}} {}",
            self.turn_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "hame_turn_seconds_count{{agent=\"{a}\"}} {}",
            self.turn_count.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP hame_steps_total Reasoning steps (model requests)."
        );
        let _ = writeln!(out, "# TYPE hame_steps_total counter");
        let _ = writeln!(
            out,
            "hame_steps_total{{agent=\"{a}\"}} {}",
            self.steps.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP hame_tool_calls_total Tool calls by name and outcome."
        );
        let _ = writeln!(out, "# TYPE hame_tool_calls_total counter");
        if let Ok(t) = self.tools.lock() {
            for ((name, outcome), n) in t.iter() {
                let _ = writeln!(
                    out,
                    "hame_tool_calls_total{{agent=\"{a}\",tool=\"{}\",outcome=\"{outcome}\"}} {n}",
                    escape(name)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP hame_model_request_seconds Latency of model requests (until the whole answer streamed)."
        );
        let _ = writeln!(out, "# TYPE hame_model_request_seconds histogram");
        let mut cumulative = 0;
        for (bound, n) in MODEL_BUCKETS.iter().zip(&self.model_buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "hame_model_request_seconds_bucket{{agent=\"{a}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.model_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "hame_model_request_seconds_bucket{{agent=\"{a}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "hame_model_request_seconds_sum{{agent=\"{a}\"}} {}",
            self.model_millis.load(Ordering::Relaxed) as f64 / 1e3
        );
        let _ = writeln!(
            out,
            "hame_model_request_seconds_count{{agent=\"{a}\"}} {count}"
        );
        let _ = writeln!(out, "# HELP hame_tokens_total Model tokens by kind.");
        let _ = writeln!(out, "# TYPE hame_tokens_total counter");
        let _ = writeln!(
            out,
            "hame_tokens_total{{agent=\"{a}\",kind=\"input\"}} {}",
            self.input_tokens.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "hame_tokens_total{{agent=\"{a}\",kind=\"output\"}} {}",
            self.output_tokens.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP hame_requests_refused_total Requests refused, by reason."
        );
        let _ = writeln!(out, "# TYPE hame_requests_refused_total counter");
        if let Ok(r) = self.refused.lock() {
            for (reason, n) in r.iter() {
                let _ = writeln!(
                    out,
                    "hame_requests_refused_total{{agent=\"{a}\",reason=\"{reason}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP hame_queue_depth Turns waiting behind a running turn of their session."
        );
        let _ = writeln!(out, "# TYPE hame_queue_depth gauge");
        let _ = writeln!(out, "hame_queue_depth{{agent=\"{a}\"}} {}", g.queue_depth);
        let _ = writeln!(out, "# HELP hame_turns_in_flight Turns running or waiting.");
        let _ = writeln!(out, "# TYPE hame_turns_in_flight gauge");
        let _ = writeln!(out, "hame_turns_in_flight{{agent=\"{a}\"}} {}", g.in_flight);
        let _ = writeln!(
            out,
            "# HELP hame_sessions Sessions the gateway holds events for."
        );
        let _ = writeln!(out, "# TYPE hame_sessions gauge");
        let _ = writeln!(out, "hame_sessions{{agent=\"{a}\"}} {}", g.sessions);
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
