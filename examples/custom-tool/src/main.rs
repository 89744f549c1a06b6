//! A custom tool in a few lines.
//!
//! `convert_temperature` converts between Celsius and Fahrenheit: an argument struct
//! (`Deserialize` + `JsonSchema`, doc comments become the schema's descriptions), one
//! `TypedTool` impl and `typed(..)` to hand it to the builder. Errors the model can fix
//! (an unknown unit) are a `ToolError` with a stable code, returned to the model as the
//! tool's result; see `docs/tools.md`.
//!
//! ```sh
//! # offline: hame-scripted-server prints the line to export
//! export OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=scripted
//! cargo run -p example-custom-tool -- ./ws "What is 100 F in Celsius?"
//! ```
#![allow(clippy::print_stdout)]

use hame::prelude::*;
use hame::{HarnessAgent, Message, RuntimeContext};

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
    let workspace = args.next().unwrap_or_else(|| "./ws".to_owned());
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
    let out = agent
        .call(Message::user(question), &RuntimeContext::new("example"))
        .await?;
    println!("{}", out.reply.text_content());
    Ok(())
}
