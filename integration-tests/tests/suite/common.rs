//! Helpers shared by the suites.

use std::sync::Arc;

use hame::harness::EnvLookup;

/// The URL of a test service from `var`, or `None` (with a loud SKIPPED line) when it is
/// not configured. Under CI a missing service is a failure.
pub fn service(var: &str) -> Option<String> {
    hame_test_env::service(var, "integration")
}

/// A unique id, so parallel tests never share keys in a shared store.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An environment holding only the scripted server's base URL.
pub fn env_for(base: &str) -> EnvLookup {
    let base = base.to_owned();
    EnvLookup(Arc::new(move |k| {
        (k == "OPENAI_BASE_URL").then(|| base.clone())
    }))
}

/// The user and assistant texts of a recorded OpenAI-style request.
pub fn dialogue(body: &serde_json::Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "user" || m["role"] == "assistant")
                .filter_map(|m| m["content"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
