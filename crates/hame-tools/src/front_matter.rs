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
}
