//! Retry notices on a terminal: one line that updates in place (`\r` + clear), instead of a
//! new line per attempt. Anywhere else (a file, a pipe) every log line stays a plain line.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the last thing written to stderr is an updating status line (no newline yet).
static OPEN: AtomicBool = AtomicBool::new(false);

/// Ends an open status line, so the next output starts on a line of its own.
pub(crate) fn clear() {
    if OPEN.swap(false, Ordering::SeqCst) {
        let mut err = std::io::stderr();
        let _ = err.write_all(b"\r\x1b[2K");
        let _ = err.flush();
    }
}

/// The tracing writer on a terminal: a retry notice replaces the previous one on the same
/// line; any other log line first ends the status line.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TtyWriter;

impl Write for TtyWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr();
        let text = String::from_utf8_lossy(buf);
        if text.contains("retrying in ") {
            let line = text.trim_end_matches('\n');
            err.write_all(b"\r\x1b[2K")?;
            err.write_all(line.as_bytes())?;
            OPEN.store(true, Ordering::SeqCst);
        } else {
            clear();
            err.write_all(buf)?;
        }
        err.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for TtyWriter {
    type Writer = TtyWriter;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}
