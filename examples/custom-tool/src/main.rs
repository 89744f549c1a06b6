//! A custom tool in a few lines.
//!
//! `convert_temperature` converts between Celsius and Fahrenheit: an argument struct
//! (`Deserialize` + `JsonSchema`, doc comments become the schema's descriptions), one
//! `TypedTool` impl and `typed(..)` to hand it to the builder. Errors the model can fix
//! (an unknown unit) are a `ToolError` with a stable code, returned to the model as the
//! tool's result; see `docs/tools.md`.
//!
//! Each tool call is shown on stderr (`tool call: NAME ARGUMENTS`, then its outcome), the
//! reply on stdout. Offline, with `script.json` beside this crate's manifest making the
//! model call the tool (from the repository root):
//!
//! ```sh
//! hame-scripted-server examples/custom-tool/script.json -- cargo run -q -p example-custom-tool
//! ```
//!
//! Against a real model: `OPENAI_API_KEY=sk-... cargo run -p example-custom-tool -- [WORKSPACE]
//! [QUESTION]` (`HAME_MODEL` picks the model, default `openai:gpt-4o-mini`; the workspace
//! defaults to `hame-custom-tool` in the system's temporary directory).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use hame::prelude::*;
use hame::{AgentEvent, CancellationToken, EventSink, HarnessAgent, Message, RuntimeContext};

/// Arguments of `convert_temperature`.
#[derive(Debug, Deserialize, JsonSchema)]
struct ConvertArgs {
    /// The temperature to convert.
    value: f64,
    /// Its unit: "C" or "F".
    from: String,
}

/// Converts a temperature between Celsius and Fahrenheit.
#[derive(Debug)]
struct ConvertTemperature;

#[async_trait]
impl TypedTool for ConvertTemperature {
    type Args = ConvertArgs;

    fn name(&self) -> &str {
        "convert_temperature"
    }

    fn description(&self) -> String {
        "Convert a temperature between Celsius (C) and Fahrenheit (F).".into()
    }

    async fn run(&self, args: ConvertArgs, _ctx: &ToolContext) -> ToolOutput {
        match args.from.trim().to_ascii_uppercase().as_str() {
            "C" => Ok(format!(
                "{} C = {:.1} F",
                args.value,
                args.value * 9.0 / 5.0 + 32.0
            )),
            "F" => Ok(format!(
                "{} F = {:.1} C",
                args.value,
                (args.value - 32.0) * 5.0 / 9.0
            )),
            // The model can fix this: it gets the code and the message as the result.
            other => Err(ToolError::invalid_arguments(format!(
                "unknown unit {other:?}: use \"C\" or \"F\""
            ))),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let workspace = args.next().map_or_else(
        || std::env::temp_dir().join("hame-custom-tool"),
        std::path::PathBuf::from,
    );
    let question = args
        .next()
        .unwrap_or_else(|| "What is 100 F in Celsius?".to_owned());
    std::fs::create_dir_all(&workspace)?;
    let env = |k: &str| std::env::var(k).ok();
    let spec = env("HAME_MODEL").unwrap_or_else(|| "openai:gpt-4o-mini".to_owned());
    let agent = HarnessAgent::builder()
        .name("thermo")
        .model(hame::model::open(&spec, &env)?)
        .workspace(&workspace)
        .tool(typed(ConvertTemperature))
        .build()?;
    // The call's events, read alongside it, show each tool call as it happens.
    let (sink, mut events) = EventSink::channel();
    let (ctx, cancel) = (RuntimeContext::new("example"), CancellationToken::new());
    let call = agent.call_with(Message::user(question), &ctx, &sink, &cancel);
    tokio::pin!(call);
    let out = loop {
        tokio::select! {
            out = &mut call => break out?,
            Some(event) = events.recv() => show(&event),
        }
    };
    while let Ok(event) = events.try_recv() {
        show(&event);
    }
    println!("{}", out.reply.text_content());
    Ok(())
}

/// Prints a tool call as it starts and ends.
fn show(event: &AgentEvent) {
    match event {
        AgentEvent::ToolStarted {
            name, arguments, ..
        } => eprintln!("tool call: {name} {arguments}"),
        AgentEvent::ToolFinished { name, is_error, .. } => {
            eprintln!("tool {name}: {}", if *is_error { "error" } else { "ok" });
        }
        _ => {}
    }
}
