//! `open("provider:model", env)`.

use hame_core::ModelError;
use hame_model::open;
use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::*;

#[tokio::test]
async fn opens_each_provider_from_env() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("from openai"));
    server.push(ScriptStep::text("from anthropic"));
    server.push(ScriptStep::text("from ollama"));
    let base = server.base_url();
    let root = server.url();
    let env = move |k: &str| match k {
        "OPENAI_BASE_URL" | "OLLAMA_BASE_URL" => Some(base.clone()),
        "OPENAI_API_KEY" => Some("sk-env".to_owned()),
        "ANTHROPIC_BASE_URL" => Some(root.clone()),
        "ANTHROPIC_API_KEY" => Some("sk-ant-env".to_owned()),
        _ => None,
    };
    let openai = open("openai:gpt-4o-mini", &env)?;
    assert_eq!(openai.info().provider, "openai");
    assert_eq!(openai.info().context_window, 128_000);
    assert_eq!(
        openai.complete(request("x")).await?.message.text_content(),
        "from openai"
    );
    let anthropic = open("anthropic:claude-sonnet-4-5", &env)?;
    assert_eq!(anthropic.info().context_window, 200_000);
    assert_eq!(
        anthropic
            .complete(request("x"))
            .await?
            .message
            .text_content(),
        "from anthropic"
    );
    let ollama = open("ollama:llama3.1:8b", &env)?;
    assert_eq!(ollama.info().model, "llama3.1:8b");
    assert_eq!(ollama.info().provider, "ollama");
    assert_eq!(
        ollama.complete(request("x")).await?.message.text_content(),
        "from ollama"
    );

    let reqs = server.requests();
    assert_eq!(reqs[0].header("authorization"), Some("Bearer sk-env"));
    assert_eq!(reqs[1].header("x-api-key"), Some("sk-ant-env"));
    assert_eq!(reqs[2].header("authorization"), None);
    assert_eq!(reqs[2].body["model"], "llama3.1:8b");
    Ok(())
}

#[test]
fn bad_specs_are_config_errors() {
    let env = |_: &str| None;
    let unknown = open("gemini:pro", &env).err();
    assert!(
        matches!(&unknown, Some(ModelError::Config(m)) if m.contains("known providers: openai, anthropic, dashscope, ollama")),
        "{unknown:?}"
    );
    assert!(matches!(open("gpt-4o", &env), Err(ModelError::Config(_))));
    assert!(matches!(open("openai:", &env), Err(ModelError::Config(_))));
}
