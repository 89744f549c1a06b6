//! Defaults shared by the clients: retries, timeouts, context windows.

use std::time::Duration;

/// Default idle timeout: the longest wait for response headers or between two stream chunks.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Default TCP/TLS connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default first-byte timeout: the longest wait from sending a request (connecting
/// included) until the response begins (its status and headers). Not retried: a server that accepted the connection and said
/// nothing for this long is not a model that answers: a `hame run` against it ends within
/// 30 s).
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(25);
/// The variable (read through `open`'s lookup) that sets the first-byte timeout in seconds.
pub const MODEL_TIMEOUT_ENV: &str = "HAME_MODEL_TIMEOUT";
/// The variable (read through `open`'s lookup) that sets the connect timeout in seconds.
pub const MODEL_CONNECT_TIMEOUT_ENV: &str = "HAME_MODEL_CONNECT_TIMEOUT";
/// The variable (read through `open`'s lookup) that sets prompt caching: `auto` (the
/// default: Anthropic breakpoints, `prompt_cache_key` to api.openai.com only), `on` (also
/// `prompt_cache_key` to every OpenAI-compatible server) or `off` (neither).
pub const PROMPT_CACHE_ENV: &str = "HAME_PROMPT_CACHE";
/// Most retries after a failure to connect (refused, unknown host, TLS handshake), however
/// large [`RetryConfig::max_retries`] is: a dead or mistyped URL should fail in well under a
/// second, not after the whole backoff. A connect *timeout* is not retried at all (it has
/// already waited [`DEFAULT_CONNECT_TIMEOUT`]).
pub const MAX_CONNECT_RETRIES: usize = 2;
/// First wait before retrying a failed connection (doubled for the second, plus jitter when
/// [`RetryConfig::jitter`] is on); used instead of [`RetryConfig::initial_delay`] when that
/// is longer.
pub const CONNECT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// Context window assumed for a model missing from [`KNOWN_CONTEXT_WINDOWS`].
pub const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;

/// How failed requests are retried (capped exponential backoff with jitter).
///
/// Only retryable errors ([`hame_core::ModelError::is_retryable`]: 429, 5xx, 408, 409,
/// transport failures) are retried, and only before the first event of a stream is
/// yielded. A `Retry-After` header replaces the computed delay, unless it is longer than
/// [`RetryConfig::max_retry_after`], in which case the error is returned at once (nothing
/// is slept) so the caller can decide. Connection failures get at most
/// [`MAX_CONNECT_RETRIES`] short retries; configuration errors (a bad base URL) none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Retries after the first attempt (0 disables retrying). Default 4.
    pub max_retries: usize,
    /// Delay before the first retry; doubled each time. Default 500 ms.
    pub initial_delay: Duration,
    /// Cap on the computed delay. Default 30 s.
    pub max_delay: Duration,
    /// Add random jitter (0 to 100 % of the current delay, so a wait is between the delay and
    /// twice it) to spread retries. Default on.
    pub jitter: bool,
    /// Longest `Retry-After` that is waited out. Default 60 s.
    pub max_retry_after: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 4,
            initial_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            jitter: true,
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryConfig {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }
}

/// Context windows (tokens) by model-name prefix; the longest matching prefix wins.
///
/// Figures are the providers' published input limits at the time of writing; set
/// `context_window` in the config for anything else.
pub const KNOWN_CONTEXT_WINDOWS: &[(&str, u64)] = &[
    // OpenAI
    ("gpt-3.5-turbo", 16_385),
    ("gpt-4", 8_192),
    ("gpt-4-32k", 32_768),
    ("gpt-4-turbo", 128_000),
    ("gpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    // Anthropic
    ("claude-", 200_000),
    // Qwen (DashScope)
    ("qwen-max", 32_768),
    ("qwen-plus", 131_072),
    ("qwen-turbo", 1_000_000),
    ("qwen-long", 10_000_000),
    ("qwen3-coder-plus", 1_000_000),
    ("qwen3-max", 262_144),
    ("qwen2.5", 131_072),
    ("qwen3", 131_072),
    // Others commonly served by vLLM / Ollama / llama.cpp
    ("deepseek-chat", 128_000),
    ("deepseek-reasoner", 128_000),
    ("llama3.1", 131_072),
    ("llama3.2", 131_072),
    ("llama3.3", 131_072),
    ("llama3", 8_192),
    ("mistral", 32_768),
];

/// The context window of `model` from [`KNOWN_CONTEXT_WINDOWS`], or
/// [`DEFAULT_CONTEXT_WINDOW`]. A `vendor/` prefix (as vLLM and OpenRouter use) is ignored.
pub fn context_window_for(model: &str) -> u64 {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    KNOWN_CONTEXT_WINDOWS
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map_or(DEFAULT_CONTEXT_WINDOW, |(_, n)| *n)
}

/// Reads the process environment; pass it to `from_env`/[`crate::open`] in applications.
/// Tests pass their own lookup instead.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn longest_prefix_wins() {
        assert_eq!(context_window_for("gpt-4o-mini"), 128_000);
        assert_eq!(context_window_for("gpt-4"), 8_192);
        assert_eq!(context_window_for("gpt-4-turbo-preview"), 128_000);
        assert_eq!(context_window_for("gpt-4.1-mini"), 1_047_576);
        assert_eq!(context_window_for("claude-sonnet-4-5"), 200_000);
        assert_eq!(context_window_for("Qwen/Qwen3-32B"), 131_072);
        assert_eq!(context_window_for("llama3.1:8b"), 131_072);
        assert_eq!(context_window_for("llama3:8b"), 8_192);
        assert_eq!(context_window_for("my-own-model"), DEFAULT_CONTEXT_WINDOW);
    }
}
