//! `hame replay SESSION`: re-runs a recorded session against the model answers recorded in
//! its log, with the same tools, and reports the first record that differs.
//!
//! Each user message of the log starts a call in a new session (`<SESSION>-replay-<unix
//! ms>`); every model request of those calls is answered with the next assistant
//! message of the log (its text and tool calls, ids included), and the tools run for real
//! against the workspace. Then the new session's log is compared with the recorded one,
//! record by record (role, text, tool calls, tool results). Exit 0 when identical, 1 at the
//! first divergence (both records are printed).
//!
//! Memory is off during a replay (a compaction or a flush would ask the model for text
//! the log does not hold). Subagent runs are not replayed: their model answers live in
//! their own session logs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use clap::Args;
use hame::session::LogRecord;
use hame::{Message, Model, ModelError, ModelEvent, ModelInfo, ModelRequest, ModelStream, Role};

use crate::common::Common;
use crate::{ConfigError, Stopped};

/// Flags of `hame replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    #[command(flatten)]
    common: Common,
    /// One JSON object {"session", "replay_session", "records", "identical", "divergence"}.
    #[arg(long)]
    json: bool,
    /// The recorded session to replay.
    #[arg(value_name = "SESSION")]
    recorded: String,
}

/// A model that answers with the recorded assistant messages, in order.
#[derive(Debug)]
struct ReplayModel {
    answers: Mutex<VecDeque<Message>>,
    served: Mutex<usize>,
}

#[async_trait::async_trait]
impl Model for ReplayModel {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "replay".into(),
            model: "recorded".into(),
            context_window: 128_000,
        }
    }

    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        let next = self.answers.lock().ok().and_then(|mut q| q.pop_front());
        let n = self.served.lock().map(|mut s| {
            *s += 1;
            *s
        });
        let Some(message) = next else {
            return Err(ModelError::InvalidResponse(format!(
                "replay: model request {} has no recorded answer (the harness asked the model more often than the recording)",
                n.unwrap_or_default()
            )));
        };
        let mut events = Vec::new();
        let text = message.text_content();
        if !text.is_empty() {
            events.push(Ok(ModelEvent::TextDelta(text)));
        }
        let mut calls = 0;
        for (index, c) in message.tool_calls().enumerate() {
            calls += 1;
            events.push(Ok(ModelEvent::ToolCallStart {
                index,
                id: c.id.clone(),
                name: c.name.clone(),
            }));
            events.push(Ok(ModelEvent::ToolCallDelta {
                index,
                arguments: c.arguments.clone(),
            }));
        }
        events.push(Ok(ModelEvent::Stop(if calls > 0 {
            hame::StopReason::ToolUse
        } else {
            hame::StopReason::EndTurn
        })));
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

/// What is compared of a record: role, text, tool calls and tool results.
fn shape(r: &LogRecord) -> String {
    let role = format!("{:?}", r.role).to_ascii_lowercase();
    let mut parts = vec![format!("{role}: {}", r.message.text_content())];
    for c in r.message.tool_calls() {
        parts.push(format!("call {} {}({})", c.id, c.name, c.arguments));
    }
    for t in r.message.tool_results_iter() {
        parts.push(format!(
            "result {}{}: {}",
            t.id,
            if t.is_error { " (error)" } else { "" },
            t.content
        ));
    }
    parts.join(" | ")
}

/// A record's shape on one line, cut to 300 characters.
fn clip(s: &str) -> String {
    let s = s.replace('\n', "\\n");
    if s.chars().count() > 300 {
        format!("{}…", s.chars().take(300).collect::<String>())
    } else {
        s
    }
}

/// `hame replay`.
pub(crate) async fn replay(mut args: ReplayArgs) -> anyhow::Result<()> {
    args.common.replay_settings();
    let model = Arc::new(ReplayModel {
        answers: Mutex::new(VecDeque::new()),
        served: Mutex::new(0),
    });
    let hook = {
        let model = model.clone();
        move |_: Arc<dyn Model>| -> Arc<dyn Model> { model }
    };
    let (agent, ctx) = crate::common::build_with(&args.common, false, Some(Box::new(hook))).await?;
    let recorded = agent
        .session_records(&ctx, &args.recorded)
        .await
        .map_err(|e| ConfigError(e.to_string()))?
        .ok_or_else(|| {
            ConfigError(format!(
                "no session {} (of agent {}); `hame sessions` lists them",
                args.recorded,
                agent.name()
            ))
        })?;
    if let Ok(mut q) = model.answers.lock() {
        q.extend(
            recorded
                .iter()
                .filter(|r| r.role == Role::Assistant)
                .map(|r| r.message.clone()),
        );
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let base: String = args.recorded.chars().take(90).collect();
    let mut replay_ctx = ctx.clone();
    // A session of its own: never one that has a log already.
    for n in 0.. {
        replay_ctx.session_id = match n {
            0 => format!("{base}-replay-{stamp}"),
            n => format!("{base}-replay-{stamp}-{n}"),
        };
        let taken = agent
            .session_records(&replay_ctx, &replay_ctx.session_id)
            .await
            .map_err(|e| ConfigError(e.to_string()))?
            .is_some();
        if !taken {
            break;
        }
    }
    if !args.json {
        eprintln!(
            "hame: replaying session {} ({} records) as {}; its tool calls run again in {}",
            args.recorded,
            recorded.len(),
            replay_ctx.session_id,
            agent.workspace().display()
        );
    }
    let mut call_error = None;
    for r in recorded
        .iter()
        .filter(|r| r.role == Role::User && r.message.tool_results_iter().next().is_none())
    {
        let message = Message::user(r.message.text_content());
        if let Err(e) = agent.call(message, &replay_ctx).await {
            call_error = Some(e.to_string());
            break;
        }
    }
    let replayed = agent
        .session_records(&replay_ctx, &replay_ctx.session_id)
        .await
        .map_err(|e| ConfigError(e.to_string()))?
        .unwrap_or_default();
    let divergence = (0..recorded.len().max(replayed.len())).find_map(|i| {
        let a = recorded.get(i).map(shape);
        let b = replayed.get(i).map(shape);
        (a != b).then_some((i, a, b))
    });
    crate::run::finish(&agent).await?;
    if args.json {
        let div = divergence
            .as_ref()
            .map(|(i, a, b)| serde_json::json!({"record": i, "recorded": a, "replayed": b}));
        println!(
            "{}",
            serde_json::json!({
                "session": args.recorded,
                "replay_session": replay_ctx.session_id,
                "records": recorded.len(),
                "identical": divergence.is_none(),
                "divergence": div,
                "error": call_error,
            })
        );
        return match divergence {
            None => Ok(()),
            Some(_) => Err(Stopped(1, "the replay diverged".into()).into()),
        };
    }
    match divergence {
        None => {
            println!(
                "identical: {} records of session {} replayed",
                recorded.len(),
                args.recorded
            );
            Ok(())
        }
        Some((i, a, b)) => {
            println!("first divergence at record #{i}:");
            println!("  recorded: {}", a.as_deref().map_or("(none)".into(), clip));
            println!("  replayed: {}", b.as_deref().map_or("(none)".into(), clip));
            if let Some(e) = call_error {
                println!("  (the replayed call failed: {})", clip(&e));
            }
            Err(Stopped(1, format!("the replay diverged at record #{i}")).into())
        }
    }
}
