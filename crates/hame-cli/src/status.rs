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

/// Frames of the waiting spinner.
const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// How often the spinner redraws.
const TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// A line on a terminal's stderr that shows how long hame has been waiting for the model
/// (`⠋ waiting for the model 2.4 s`), redrawn in place until [`Spinner::stop`]. Off when
/// stderr is not a terminal (a pipe or a file gets no spinner characters at all).
#[derive(Debug, Clone)]
pub(crate) struct Spinner {
    /// When the current wait began; `None` while nothing is awaited. Held while drawing, so
    /// a stop never races a frame.
    since: Option<std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>>,
}

impl Spinner {
    /// A spinner for this process's stderr: drawing only if it is a terminal.
    pub(crate) fn for_stderr() -> Self {
        use std::io::IsTerminal;
        Self::new(std::io::stderr().is_terminal())
    }

    /// A spinner that draws when `enabled`; its ticker task runs on the current runtime.
    pub(crate) fn new(enabled: bool) -> Self {
        if !enabled {
            return Self { since: None };
        }
        let since = std::sync::Arc::new(std::sync::Mutex::new(None::<std::time::Instant>));
        let weak = std::sync::Arc::downgrade(&since);
        tokio::spawn(async move {
            let mut frame = 0usize;
            loop {
                tokio::time::sleep(TICK).await;
                let Some(since) = weak.upgrade() else { return };
                let guard = match since.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                if let Some(start) = *guard {
                    frame = (frame + 1) % FRAMES.len();
                    let secs = start.elapsed().as_secs_f64();
                    let mut err = std::io::stderr();
                    let _ = write!(
                        err,
                        "\r\x1b[2K\x1b[2m{} waiting for the model {secs:.1} s\x1b[0m",
                        FRAMES[frame]
                    );
                    let _ = err.flush();
                    OPEN.store(true, Ordering::SeqCst);
                }
            }
        });
        Self { since: Some(since) }
    }

    /// Starts (or restarts) the wait.
    pub(crate) fn start(&self) {
        if let Some(since) = &self.since {
            let mut guard = match since.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            *guard = Some(std::time::Instant::now());
        }
    }

    /// Ends the wait and erases the line.
    pub(crate) fn stop(&self) {
        if let Some(since) = &self.since {
            let mut guard = match since.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            *guard = None;
            clear();
        }
    }
}
