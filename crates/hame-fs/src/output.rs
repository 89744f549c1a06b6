//! What a command printed, as the model sees it: the one rendering that every [`Execute`]
//! backend (the local shell, the Docker sandbox) uses, so a tool's output reads the same
//! wherever the command ran.
//!
//! [`Execute`]: crate::Execute

/// The bytes one pipe of a command printed, up to a cap, and whether more was printed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CappedOutput {
    /// The bytes kept: the first `cap` the pipe printed.
    pub kept: Vec<u8>,
    /// More than `cap` bytes were printed; the rest was dropped.
    pub truncated: bool,
    /// Every byte the pipe printed, kept or dropped.
    pub total: u64,
}

impl CappedOutput {
    /// Keeps what of `bytes` fits under `cap` bytes in all and marks the rest as dropped.
    pub fn push(&mut self, bytes: &[u8], cap: usize) {
        self.total += bytes.len() as u64;
        let room = cap.saturating_sub(self.kept.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// stdout, then each stderr line prefixed `[stderr] `, cut at `cap` bytes (on a character
/// boundary) and ended with `[output truncated at {cap} bytes]` when anything was dropped.
/// Returns the text and whether it was truncated.
///
/// ```
/// use hame_fs::{CappedOutput, render_output};
/// let mut out = CappedOutput::default();
/// out.push(b"built\n", 100);
/// let mut err = CappedOutput::default();
/// err.push(b"warning: unused", 100);
/// assert_eq!(render_output(out, err, 100), ("built\n[stderr] warning: unused\n".to_owned(), false));
/// ```
pub fn render_output(stdout: CappedOutput, stderr: CappedOutput, cap: usize) -> (String, bool) {
    let mut text = String::from_utf8_lossy(&stdout.kept).into_owned();
    for line in String::from_utf8_lossy(&stderr.kept).lines() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr] ");
        text.push_str(line);
        text.push('\n');
    }
    let mut truncated = stdout.truncated || stderr.truncated;
    if text.len() > cap {
        let mut cut = cap;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        truncated = true;
    }
    if truncated {
        text.push_str(&format!("\n[output truncated at {cap} bytes]"));
    }
    (text, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_lands_on_a_character_boundary_and_says_so() {
        let mut out = CappedOutput::default();
        out.push("ééé".as_bytes(), 100);
        let (text, truncated) = render_output(out, CappedOutput::default(), 3);
        assert_eq!(text, "é\n[output truncated at 3 bytes]");
        assert!(truncated);
    }

    #[test]
    fn a_pipe_keeps_its_first_bytes_and_remembers_the_rest() {
        let mut out = CappedOutput::default();
        out.push(b"abc", 4);
        out.push(b"def", 4);
        assert_eq!(
            out,
            CappedOutput {
                kept: b"abcd".to_vec(),
                truncated: true,
                total: 6,
            }
        );
    }
}
