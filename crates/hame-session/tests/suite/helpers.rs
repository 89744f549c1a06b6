//! Shared test helpers.

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use hame_core::{ContentBlock, Message, Role, ToolCall, ToolResult, Usage};
use hame_fs::Filesystem;
use hame_session::{SessionLog, SessionLogOptions};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// 2025-01-02T03:04:05Z plus `secs`.
pub fn t(secs: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap() + chrono::Duration::seconds(secs)
}

/// Options with a clock fixed at `t(secs)`.
pub fn fixed_clock(secs: i64) -> SessionLogOptions {
    SessionLogOptions::default().with_clock(move || t(secs))
}

/// A log with a fixed clock.
pub fn log_at(fs: Arc<dyn Filesystem>, secs: i64) -> SessionLog {
    SessionLog::with_options(fs, "main", fixed_clock(secs)).unwrap()
}

/// A user → assistant (tool call) → tool result → assistant exchange.
pub fn exchange(question: &str, arguments: &str, result: &str) -> Vec<Message> {
    vec![
        Message::user(question),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Text {
                    text: "Let me look.".into(),
                },
                ContentBlock::ToolCall(ToolCall {
                    id: "t1".into(),
                    name: "read_file".into(),
                    arguments: arguments.into(),
                }),
            ]
            .into(),
            usage: Some(Usage {
                input_tokens: 120,
                output_tokens: 30,
                cached_input_tokens: 0,
                cache_write_input_tokens: 0,
            }),
        },
        Message::tool_results(vec![ToolResult {
            id: "t1".into(),
            content: result.into(),
            is_error: false,
            code: None,
        }]),
        Message::assistant("Done."),
    ]
}
