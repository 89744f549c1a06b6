//! Quickstart: build an agent over a workspace and ask it one question.
//!
//! ```sh
//! OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... \
//!   cargo run -p example-quickstart -- ./ws "What do you know about me?"
//! ```
#![allow(clippy::print_stdout)]

use hame::{HarnessAgent, Message, RuntimeContext};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let workspace = args.next().unwrap_or_else(|| "./ws".to_owned());
    let question = args
        .next()
        .unwrap_or_else(|| "Introduce yourself.".to_owned());

    let env = |k: &str| std::env::var(k).ok();
    let model_spec = env("HAME_MODEL").unwrap_or_else(|| "openai:gpt-4o-mini".to_owned());
    let agent = HarnessAgent::builder()
        .name("quickstart")
        .model(hame::model::open(&model_spec, &env)?)
        .workspace(workspace)
        .build()?;

    // The same (user, session) pair continues the same conversation on the next run.
    let ctx = RuntimeContext::new("quickstart").with_user("me");
    let out = agent.call(Message::user(question), &ctx).await?;
    println!("{}", out.reply.text_content());
    Ok(())
}
