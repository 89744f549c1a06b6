//! The `---` YAML front matter of the workspace's Markdown files (`skills/<name>/SKILL.md`,
//! `subagents/<id>.md`): one splitter, so both read the same files the same way.

/// Why a text has no front matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontMatterError {
    /// The text does not start with a `---` line.
    NoOpening,
    /// The `---` block is not closed by a `---` line.
    NoClosing,
}

/// Splits `---\n<yaml>---\n<body>` into the YAML and the body. A leading byte-order mark
/// and `\r\n` line ends are accepted; the closing `---` is a line of its own (it may end
/// the text without a line break).
///
/// ```
/// use hame_tools::front_matter::split;
/// assert_eq!(split("---\na: 1\n---\nbody"), Ok(("a: 1\n", "body")));
/// ```
pub fn split(text: &str) -> Result<(&str, &str), FrontMatterError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or(FrontMatterError::NoOpening)?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']) == "---" {
            return Ok((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    Err(FrontMatterError::NoClosing)
}

/// Parse results remembered by their input: the workspace files that configure a step
/// (`SKILL.md`, `subagents/<id>.md`, `tools.json`) are read at every reasoning step (an
/// edit applies at the next one), but an unchanged text need not be parsed again (YAML is
/// the costly part of a step with a few skills and subagents).
/// At most `max_entries` results of inputs up to `max_text` bytes are kept; past that the
/// memo starts over; a longer input is parsed every time. Only pure parses belong here:
/// the result must depend on the key alone.
///
/// ```
/// use hame_tools::front_matter::ParseMemo;
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
    results: std::sync::Mutex<std::collections::HashMap<String, V>>,
    max_entries: usize,
    max_text: usize,
}

impl<V: Clone> ParseMemo<V> {
    /// A memo of at most `max_entries` results of inputs of at most `max_text` bytes.
    pub fn new(max_entries: usize, max_text: usize) -> Self {
        Self {
            results: std::sync::Mutex::default(),
            max_entries,
            max_text,
        }
    }

    /// The result of `parse` for the input made of `parts` (e.g. a file's name and text):
    /// remembered, or computed now (and remembered when the input is small enough).
    pub fn get_or_parse(&self, parts: &[&str], parse: impl FnOnce() -> V) -> V {
        let len: usize = parts.iter().map(|p| p.len() + 1).sum();
        if len > self.max_text {
            return parse();
        }
        let mut key = String::with_capacity(len);
        for p in parts {
            key.push_str(p);
            // Parts are joined by a byte no file name or UTF-8 text part holds ambiguously.
            key.push('\0');
        }
        let lock = || {
            self.results
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(v) = lock().get(&key) {
            return v.clone();
        }
        let v = parse();
        let mut results = lock();
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
    fn splits_the_forms_the_workspace_files_use() {
        assert_eq!(
            split("---\na: 1\n---\n\nbody\n"),
            Ok(("a: 1\n", "\nbody\n"))
        );
        assert_eq!(
            split("\u{feff}---\r\na: 1\r\n---\r\nb"),
            Ok(("a: 1\r\n", "b"))
        );
        assert_eq!(split("---\na: 1\n---"), Ok(("a: 1\n", "")));
        assert_eq!(split("---\n---\nbody"), Ok(("", "body")));
        // `----` or `--- x` does not close the block.
        assert_eq!(
            split("---\na\n----\n--- x\n"),
            Err(FrontMatterError::NoClosing)
        );
        assert_eq!(split("a: 1\n---\n"), Err(FrontMatterError::NoOpening));
        assert_eq!(split(""), Err(FrontMatterError::NoOpening));
    }

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
}
