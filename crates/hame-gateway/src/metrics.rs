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
    /// Input tokens read from the provider's prompt cache (part of `input_tokens`).
    cached_input_tokens: AtomicU64,
    /// Input tokens written to the provider's prompt cache (part of `input_tokens`).
    cache_write_input_tokens: AtomicU64,
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
            hame::AgentEvent::ToolFinished {
                name,
                is_error,
                code,
                ..
            } => {
                if let Ok(mut t) = self.tools.lock() {
                    let outcome = if *is_error { "error" } else { "ok" };
                    *t.entry((tool_label(name, code.as_deref()), outcome))
                        .or_default() += 1;
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
                self.cached_input_tokens
                    .fetch_add(usage.cached_input_tokens, Ordering::Relaxed);
                self.cache_write_input_tokens
                    .fetch_add(usage.cache_write_input_tokens, Ordering::Relaxed);
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
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut x = Exposition::new(agent);
        x.family(
            "hame_turns_total",
            "counter",
            "Turns (calls and resumes) by outcome.",
        );
        if let Ok(t) = self.turns.lock() {
            for (outcome, n) in t.iter() {
                x.sample("hame_turns_total", &[("outcome", outcome)], n);
            }
        }
        x.family("hame_turn_seconds", "summary", "Wall time of turns.");
        x.sample(
            "hame_turn_seconds_sum",
            &[],
            load(&self.turn_micros) as f64 / 1e6,
        );
        x.sample("hame_turn_seconds_count", &[], load(&self.turn_count));
        x.family(
            "hame_steps_total",
            "counter",
            "Reasoning steps (model requests).",
        );
        x.sample("hame_steps_total", &[], load(&self.steps));
        x.family(
            "hame_tool_calls_total",
            "counter",
            "Tool calls by name (`other` for a name no catalog has) and outcome.",
        );
        if let Ok(t) = self.tools.lock() {
            for ((name, outcome), n) in t.iter() {
                x.sample(
                    "hame_tool_calls_total",
                    &[("tool", name), ("outcome", outcome)],
                    n,
                );
            }
        }
        x.family(
            "hame_model_request_seconds",
            "histogram",
            "Latency of model requests (until the whole answer streamed).",
        );
        let mut cumulative = 0;
        for (bound, n) in MODEL_BUCKETS.iter().zip(&self.model_buckets) {
            cumulative += load(n);
            x.sample(
                "hame_model_request_seconds_bucket",
                &[("le", &bound.to_string())],
                cumulative,
            );
        }
        let count = load(&self.model_count);
        x.sample(
            "hame_model_request_seconds_bucket",
            &[("le", "+Inf")],
            count,
        );
        x.sample(
            "hame_model_request_seconds_sum",
            &[],
            load(&self.model_millis) as f64 / 1e3,
        );
        x.sample("hame_model_request_seconds_count", &[], count);
        x.family(
            "hame_tokens_total",
            "counter",
            "Model tokens by kind (cached and cache_write are parts of input).",
        );
        x.sample(
            "hame_tokens_total",
            &[("kind", "input")],
            load(&self.input_tokens),
        );
        x.sample(
            "hame_tokens_total",
            &[("kind", "output")],
            load(&self.output_tokens),
        );
        x.sample(
            "hame_tokens_total",
            &[("kind", "cached")],
            load(&self.cached_input_tokens),
        );
        x.sample(
            "hame_tokens_total",
            &[("kind", "cache_write")],
            load(&self.cache_write_input_tokens),
        );
        x.family(
            "hame_requests_refused_total",
            "counter",
            "Requests refused, by reason.",
        );
        if let Ok(r) = self.refused.lock() {
            for (reason, n) in r.iter() {
                x.sample("hame_requests_refused_total", &[("reason", reason)], n);
            }
        }
        x.family(
            "hame_queue_depth",
            "gauge",
            "Turns waiting behind a running turn of their session.",
        );
        x.sample("hame_queue_depth", &[], g.queue_depth);
        x.family("hame_turns_in_flight", "gauge", "Turns running or waiting.");
        x.sample("hame_turns_in_flight", &[], g.in_flight);
        x.family(
            "hame_sessions",
            "gauge",
            "Sessions the gateway holds events for.",
        );
        x.sample("hame_sessions", &[], g.sessions);
        x.out
    }
}

/// The `tool` label of a finished call: its name, or [`OTHER_TOOL`] for a name that is in
/// no catalog (the call failed with `unknown_tool`), so that names a model invents do not
/// each become a series.
fn tool_label(name: &str, code: Option<&str>) -> String {
    if code == Some(hame::codes::UNKNOWN_TOOL) {
        OTHER_TOOL.to_owned()
    } else {
        name.to_owned()
    }
}

/// The `tool` label of calls to tools that do not exist.
pub(crate) const OTHER_TOOL: &str = "other";

/// The Prometheus text format, one family at a time; every sample is labelled with the
/// agent, label values escaped.
struct Exposition {
    out: String,
    agent: String,
}

impl Exposition {
    fn new(agent: &str) -> Self {
        Self {
            out: String::new(),
            agent: escape(agent),
        }
    }

    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let _ = write!(self.out, "{name}{{agent=\"{}\"", self.agent);
        for (k, v) in labels {
            let _ = write!(self.out, ",{k}=\"{}\"", escape(v));
        }
        let _ = writeln!(self.out, "}} {value}");
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(name: &str, code: Option<&str>) -> hame::AgentEvent {
        hame::AgentEvent::ToolFinished {
            id: "c".into(),
            name: name.into(),
            duration_ms: 1,
            is_error: code.is_some(),
            code: code.map(str::to_owned),
        }
    }

    #[test]
    fn invented_tool_names_share_one_series() {
        let m = Metrics::default();
        m.event(&finished("read_file", None));
        m.event(&finished("made_up_1", Some(hame::codes::UNKNOWN_TOOL)));
        m.event(&finished("made_up_2", Some(hame::codes::UNKNOWN_TOOL)));
        m.event(&finished("read_file", Some("file_not_found")));
        let g = Gauges {
            queue_depth: 0,
            sessions: 0,
            in_flight: 0,
        };
        let text = m.render("a", &g);
        let tools: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("hame_tool_calls_total{"))
            .collect();
        pretty_assertions::assert_eq!(
            tools,
            vec![
                r#"hame_tool_calls_total{agent="a",tool="other",outcome="error"} 2"#,
                r#"hame_tool_calls_total{agent="a",tool="read_file",outcome="error"} 1"#,
                r#"hame_tool_calls_total{agent="a",tool="read_file",outcome="ok"} 1"#,
            ]
        );
    }
}
