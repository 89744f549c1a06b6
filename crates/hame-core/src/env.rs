//! Reading environment variables through a value that can be a copy taken at start-up.
//!
//! The CLI scrubs secret values from its own environment once the agent is built (so the
//! commands its shell runs cannot read them through `/proc`), after which the process
//! environment holds blanks for them. Whatever reads a variable later — the `${VAR}` of
//! `tools.json` per call, a remote subagent's `a2a_auth_env` per run — reads it through an
//! [`EnvLookup`] taken before that: [`EnvLookup::snapshot`].

use std::collections::HashMap;
use std::sync::Arc;

/// A function that looks up an environment variable.
pub type EnvFn = dyn Fn(&str) -> Option<String> + Send + Sync;

/// Reads environment variables; the default reads the process environment.
#[derive(Clone)]
pub struct EnvLookup(pub Arc<EnvFn>);

impl std::fmt::Debug for EnvLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvLookup")
    }
}

impl Default for EnvLookup {
    fn default() -> Self {
        Self::process()
    }
}

impl EnvLookup {
    /// The process environment, as it is at each lookup.
    pub fn process() -> Self {
        Self(Arc::new(|k| std::env::var(k).ok()))
    }
    /// A copy of the process environment taken now: later changes (the CLI scrubs secret
    /// values after the agent is built) do not reach it.
    pub fn snapshot() -> Self {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self(Arc::new(move |k| vars.get(k).cloned()))
    }
    /// Looks up `key`; blank values count as unset.
    pub fn get(&self, key: &str) -> Option<String> {
        (self.0)(key).filter(|v| !v.trim().is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_values_are_unset_and_a_lookup_can_be_any_function() {
        let env = EnvLookup(Arc::new(|k| match k {
            "A" => Some("x".into()),
            "B" => Some("  ".into()),
            _ => None,
        }));
        assert_eq!(env.get("A").as_deref(), Some("x"));
        assert_eq!(env.get("B"), None);
        assert_eq!(env.get("C"), None);
    }
}
