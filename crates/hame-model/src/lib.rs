//! # hame-model
//!
//! HTTP clients that implement [`hame_core::Model`]: `OpenAiModel` for the OpenAI Chat
//! Completions API and every server that speaks it (OpenAI, DashScope/Qwen compatible
//! mode, vLLM, Ollama, llama.cpp), and `AnthropicModel` for the Anthropic Messages API.
//!
//! Depend on it to talk to a real model; the harness and the CLI pick a client with
//! [`open`] (`"openai:gpt-4o-mini"`, `"anthropic:claude-sonnet-4-5"`). Tests of other crates
//! point these clients at the scripted server of `hame-test-support`.
//!
//! What every client does:
//! * streams with SSE, assembling tool-call arguments split across chunks;
//! * classifies failures into [`ModelError`]: context overflow (OpenAI, Anthropic,
//!   DashScope, vLLM, llama.cpp bodies), 429 with `Retry-After`, 5xx, auth (naming the
//!   key's env var and the URL, never retried), transport;
//! * retries retryable failures with capped exponential backoff and jitter ([`RetryConfig`]),
//!   honouring `Retry-After` up to [`RetryConfig::max_retry_after`], and only before the
//!   first event of a stream; a failure to connect gets at most [`MAX_CONNECT_RETRIES`]
//!   short retries, so a dead URL fails in well under a second;
//! * checks the base URL when the client is built (a bad URL or port is
//!   [`ModelError::Config`] naming its variable, e.g. `OPENAI_BASE_URL`), appends `/v1` to
//!   an OpenAI-compatible URL without a path, and never shows credentials of a URL in a
//!   message, log line or `Debug` output;
//! * reports a reply cut off at the output token limit before any text or tool call as
//!   [`ModelError::InvalidResponse`] (saying to raise `max_tokens`), not as an empty answer.
//!
//! | feature | what it adds |
//! |---|---|
//! | `openai` | `OpenAiModel`, `OpenAiConfig`; pulls in reqwest (rustls), eventsource-stream, backon |
//! | `anthropic` | `AnthropicModel`, `AnthropicConfig`; same dependencies |
//!
//! Without features the crate only has [`open`] (which then names the missing feature),
//! the error classifiers and the context-window table.
//!
//! ```
//! use hame_model::{open, context_window_for};
//! let env = |name: &str| match name {
//!     "OPENAI_BASE_URL" => Some("http://127.0.0.1:11434/v1".to_owned()),
//!     _ => None,
//! };
//! match open("openai:llama3.1:8b", &env) {
//!     Ok(model) => assert_eq!(model.info().context_window, context_window_for("llama3.1:8b")),
//!     // built without the `openai` feature
//!     Err(e) => assert!(e.to_string().contains("feature `openai`")),
//! }
//! assert!(open("nope:x", &env).is_err());
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[cfg(feature = "anthropic")]
mod anthropic;
pub mod classify;
mod config;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod endpoint;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod http;
#[cfg(feature = "openai")]
mod openai;

use std::sync::Arc;

pub use config::{
    CONNECT_RETRY_DELAY, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONTEXT_WINDOW,
    DEFAULT_FIRST_BYTE_TIMEOUT, DEFAULT_TIMEOUT, KNOWN_CONTEXT_WINDOWS, MAX_CONNECT_RETRIES,
    MODEL_CONNECT_TIMEOUT_ENV, MODEL_TIMEOUT_ENV, PROMPT_CACHE_ENV, RetryConfig,
    context_window_for, process_env,
};
pub use hame_core::{Model, ModelError};

#[cfg(feature = "anthropic")]
pub use anthropic::{
    ANTHROPIC_DEFAULT_BASE_URL, ANTHROPIC_DEFAULT_MAX_TOKENS, ANTHROPIC_MAX_CACHE_BREAKPOINTS,
    ANTHROPIC_VERSION, AnthropicConfig, AnthropicModel,
};
#[cfg(feature = "openai")]
pub use openai::{OPENAI_DEFAULT_BASE_URL, OpenAiConfig, OpenAiModel};

/// This crate's error: the model error of the core contract.
pub type Error = ModelError;
/// `Result` with [`ModelError`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// A provider [`open`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider {
    /// Name before the `:` in a spec.
    pub name: &'static str,
    /// Cargo feature that enables it.
    pub feature: &'static str,
    /// Variable holding the base URL.
    pub base_url_var: &'static str,
    /// Default base URL.
    pub default_base_url: &'static str,
    /// Variable holding the API key.
    pub api_key_var: &'static str,
    /// Whether the default endpoint needs a key (a local server's does not).
    pub key_required: bool,
}

/// The providers [`open`] knows, in the order error messages list them.
pub const PROVIDERS: &[Provider] = &[
    Provider {
        name: "openai",
        feature: "openai",
        base_url_var: "OPENAI_BASE_URL",
        default_base_url: "https://api.openai.com/v1",
        api_key_var: "OPENAI_API_KEY",
        key_required: true,
    },
    Provider {
        name: "anthropic",
        feature: "anthropic",
        base_url_var: "ANTHROPIC_BASE_URL",
        default_base_url: "https://api.anthropic.com",
        api_key_var: "ANTHROPIC_API_KEY",
        key_required: true,
    },
    Provider {
        name: "dashscope",
        feature: "openai",
        base_url_var: "DASHSCOPE_BASE_URL",
        default_base_url: "https://dashscope.aliyuncs.com/compatible-mode/v1",
        api_key_var: "DASHSCOPE_API_KEY",
        key_required: true,
    },
    Provider {
        name: "ollama",
        feature: "openai",
        base_url_var: "OLLAMA_BASE_URL",
        default_base_url: "http://127.0.0.1:11434/v1",
        api_key_var: "OLLAMA_API_KEY",
        key_required: false,
    },
];

/// Whether `base_url` is the default endpoint of a provider [`open`] knows (its variable was
/// likely never set, so a failure to reach it is the network's, not the variable's).
pub fn is_default_endpoint(base_url: &str) -> bool {
    default_provider_of(base_url).is_some()
}

/// The provider whose default endpoint `base_url` is.
fn default_provider_of(base_url: &str) -> Option<&'static Provider> {
    let url = base_url.trim().trim_end_matches('/');
    PROVIDERS.iter().find(|p| p.default_base_url == url)
}

/// Whether `base_url` is a provider's default endpoint that needs a key (a request to it
/// without one is refused before it is sent, naming the key's variable).
pub fn needs_key(base_url: &str) -> bool {
    default_provider_of(base_url).is_some_and(|p| p.key_required)
}

/// Opens a model from a `provider:model` spec, reading base URLs and keys through `env`
/// (pass [`process_env`] in applications, a closure in tests).
///
/// Providers: `openai` (`OPENAI_BASE_URL`, `OPENAI_API_KEY`), `anthropic`
/// (`ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`), `dashscope` (`DASHSCOPE_BASE_URL`,
/// `DASHSCOPE_API_KEY`, OpenAI-compatible mode) and `ollama` (`OLLAMA_BASE_URL`, no key
/// needed). The model name may itself contain `:` (`ollama:llama3.1:8b`).
/// [`MODEL_TIMEOUT_ENV`] and [`MODEL_CONNECT_TIMEOUT_ENV`] (seconds, e.g. `30` or `2.5`)
/// set the first-byte and connect timeouts; [`PROMPT_CACHE_ENV`] (`auto`, `on`, `off`)
/// prompt caching.
///
/// # Errors
/// [`ModelError::Config`] for a malformed spec, an unknown provider (the message lists
/// the known ones), a provider whose cargo feature is off (the message names it), or a
/// timeout that is not a positive number of seconds. Without a key, a provider's default
/// endpoint that needs one fails at the first request, before anything is sent, with a
/// [`ModelError::Config`] naming the key's variable.
pub fn open(spec: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Arc<dyn Model>> {
    let Some((name, model)) = spec.split_once(':') else {
        return Err(ModelError::Config(format!(
            "model spec {spec:?} is not `provider:model` (e.g. `openai:gpt-4o-mini`)"
        )));
    };
    if model.trim().is_empty() {
        return Err(ModelError::Config(format!(
            "model spec {spec:?} names no model"
        )));
    }
    let Some(provider) = PROVIDERS.iter().find(|p| p.name == name) else {
        let known: Vec<&str> = PROVIDERS.iter().map(|p| p.name).collect();
        return Err(ModelError::Config(format!(
            "unknown model provider {name:?} in {spec:?}; known providers: {}",
            known.join(", ")
        )));
    };
    open_provider(provider, model, env)
}

/// A timeout in seconds read through `env`, if set.
fn timeout_env(
    env: &dyn Fn(&str) -> Option<String>,
    var: &str,
) -> Result<Option<std::time::Duration>> {
    let Some(raw) = env(var).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match raw.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
            Ok(Some(std::time::Duration::from_secs_f64(secs)))
        }
        _ => Err(ModelError::Config(format!(
            "{var}={raw:?} is not a timeout: give seconds, more than 0 (e.g. 30 or 2.5)"
        ))),
    }
}

/// Prompt caching as [`PROMPT_CACHE_ENV`] sets it: `None` for `auto` (or unset),
/// `Some(on)` otherwise.
fn prompt_cache_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<bool>> {
    let Some(raw) = env(PROMPT_CACHE_ENV).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match raw.trim() {
        "auto" => Ok(None),
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        _ => Err(ModelError::Config(format!(
            "{PROMPT_CACHE_ENV}={raw:?} is not a prompt cache setting: give auto, on or off"
        ))),
    }
}

#[allow(unused_variables)]
fn open_provider(
    p: &Provider,
    model: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Model>> {
    let first_byte = timeout_env(env, MODEL_TIMEOUT_ENV)?;
    let connect = timeout_env(env, MODEL_CONNECT_TIMEOUT_ENV)?;
    let cache = prompt_cache_env(env)?;
    #[allow(unused_macros)]
    macro_rules! with_timeouts {
        ($config:expr) => {{
            let mut c = $config;
            if let Some(t) = first_byte {
                c.first_byte_timeout = t;
            }
            if let Some(t) = connect {
                c.connect_timeout = t;
            }
            c
        }};
    }
    match p.feature {
        #[cfg(feature = "openai")]
        "openai" => {
            let mut config = OpenAiConfig::from_env_vars(
                model,
                env,
                p.base_url_var,
                p.api_key_var,
                p.default_base_url,
            );
            p.name.clone_into(&mut config.provider);
            config.prompt_cache_key = cache;
            Ok(Arc::new(OpenAiModel::new(with_timeouts!(config))?))
        }
        #[cfg(feature = "anthropic")]
        "anthropic" => {
            let mut config = AnthropicConfig::from_env(model, env);
            config.prompt_cache = cache != Some(false);
            Ok(Arc::new(AnthropicModel::new(with_timeouts!(config))?))
        }
        feature => Err(ModelError::Config(format!(
            "provider {:?} needs hame-model's cargo feature `{feature}`, which this build lacks",
            p.name
        ))),
    }
}
