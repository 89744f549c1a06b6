//! [`ParseMemo`]: results of pure parses remembered by their input.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Parse results remembered by their input. The workspace files that configure a step
/// (`SKILL.md`, `subagents/<id>.md`, `tools.json`) are read at every reasoning step (an
/// edit applies at the next one), but an unchanged text need not be parsed again (YAML is
/// the costly part of a step with a few skills and subagents; a permission rule's glob
/// compiles to a regex). At most `max_entries` results of inputs up to `max_text` bytes
/// are kept; past that the memo starts over; a longer input is parsed every time. Only
/// pure parses belong here: the result must depend on the input alone.
///
/// ```
/// use hame_tools::memo::ParseMemo;
/// let memo: ParseMemo<usize> = ParseMemo::new(16, 1024);
/// let mut parses = 0;
/// for _ in 0..3 {
///     let n = memo.get_or_parse(&["a.md", "---\nx: 1\n---\n"], || {
///         parses += 1;
///         7
///     });
///     assert_eq!(n, 7);
/// }
/// assert_eq!(parses, 1);
/// ```
#[derive(Debug)]
pub struct ParseMemo<V> {
    results: Mutex<HashMap<String, V>>,
    max_entries: usize,
    max_text: usize,
}

impl<V: Clone> ParseMemo<V> {
    /// A memo of at most `max_entries` results of inputs of at most `max_text` bytes.
    pub fn new(max_entries: usize, max_text: usize) -> Self {
        Self {
            results: Mutex::default(),
            max_entries,
            max_text,
        }
    }

    fn results(&self) -> MutexGuard<'_, HashMap<String, V>> {
        self.results.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The result of `parse` for the input made of `parts` (e.g. a file's name and text):
    /// remembered, or computed now (and remembered when the input is small enough).
    pub fn get_or_parse(&self, parts: &[&str], parse: impl FnOnce() -> V) -> V {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max_text {
            return parse();
        }
        // Each part behind its length, so no two lists of parts make the same key.
        let mut key = String::with_capacity(len + 8 * parts.len());
        for p in parts {
            key.push_str(&p.len().to_string());
            key.push(':');
            key.push_str(p);
        }
        if let Some(v) = self.results().get(&key) {
            return v.clone();
        }
        let v = parse();
        let mut results = self.results();
        if results.len() >= self.max_entries {
            results.clear();
        }
        results.insert(key, v.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_parses_each_input_once_and_keeps_its_bounds() {
        let memo: ParseMemo<String> = ParseMemo::new(2, 16);
        let parses = std::cell::Cell::new(0);
        let get = |parts: &[&str]| {
            memo.get_or_parse(parts, || {
                parses.set(parses.get() + 1);
                parts.concat()
            })
        };
        assert_eq!(get(&["a", "1"]), "a1");
        assert_eq!(get(&["a", "1"]), "a1");
        assert_eq!(parses.get(), 1);
        // The parts are kept apart: ("a1", "") is another input than ("a", "1").
        assert_eq!(get(&["a1", ""]), "a1");
        assert_eq!(parses.get(), 2);
        // A third entry starts the memo over; the first input is parsed again after.
        assert_eq!(get(&["b", "2"]), "b2");
        assert_eq!(get(&["a", "1"]), "a1");
        assert_eq!(parses.get(), 4);
        // Over `max_text`: parsed every time.
        let long = "x".repeat(20);
        get(&[&long]);
        get(&[&long]);
        assert_eq!(parses.get(), 6);
    }

    #[test]
    fn parts_holding_separators_do_not_collide() {
        let memo: ParseMemo<usize> = ParseMemo::new(16, 1024);
        let inputs: [&[&str]; 4] = [&["a\0b", ""], &["a", "b\0"], &["a", "\0b"], &["1:a", ""]];
        for (i, parts) in inputs.iter().enumerate() {
            assert_eq!(memo.get_or_parse(parts, || i), i, "{parts:?}");
        }
    }
}
