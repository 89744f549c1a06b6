//! SIGINT and SIGTERM handling shared by the commands.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use hame::CancellationToken;

/// SIGINT and SIGTERM: the first cancels the running call (the one in `current`, or
/// exits at once with 130 / 143 when nothing runs); a second one exits at once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Signals {
    current: Arc<Mutex<Option<CancellationToken>>>,
    /// 130 or 143 once a signal arrived, else 0.
    code: Arc<AtomicU8>,
}

/// SIGINT and SIGTERM as one stream of exit codes (130, 143).
#[cfg(unix)]
pub(crate) struct Unix {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Unix {
    /// The handlers, or `None` with a warning when they cannot be installed.
    pub(crate) fn install() -> Option<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(int), Ok(term)) => Some(Self { int, term }),
            _ => {
                tracing::warn!("cannot install signal handlers");
                None
            }
        }
    }

    /// The next signal's exit code: 130 for SIGINT, 143 for SIGTERM.
    pub(crate) async fn next(&mut self) -> Option<u8> {
        tokio::select! {
            s = self.int.recv() => s.map(|()| 130),
            s = self.term.recv() => s.map(|()| 143),
        }
    }
}

impl Signals {
    pub(crate) fn watch() -> Self {
        let this = Self::default();
        let me = this.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            {
                let Some(mut signals) = Unix::install() else {
                    return;
                };
                while let Some(code) = signals.next().await {
                    me.arrived(code);
                }
            }
            #[cfg(not(unix))]
            {
                while tokio::signal::ctrl_c().await.is_ok() {
                    me.arrived(130);
                }
            }
        });
        this
    }

    fn arrived(&self, code: u8) {
        let running = self.current.lock().ok().and_then(|c| c.clone());
        let first = self.code.swap(code, Ordering::SeqCst) == 0;
        match running {
            Some(token) if first || !token.is_cancelled() => token.cancel(),
            _ => {
                eprintln!();
                crate::sandbox::shutdown_blocking();
                std::process::exit(i32::from(code));
            }
        }
    }

    /// A token for the next call, cancelled by the next signal.
    pub(crate) fn begin(&self) -> CancellationToken {
        self.code.store(0, Ordering::SeqCst);
        let token = CancellationToken::new();
        if let Ok(mut c) = self.current.lock() {
            *c = Some(token.clone());
        }
        token
    }

    /// The call ended: a signal now exits at once. Returns the signal's exit code, if one
    /// arrived during the call.
    pub(crate) fn end(&self) -> Option<u8> {
        if let Ok(mut c) = self.current.lock() {
            *c = None;
        }
        match self.code.load(Ordering::SeqCst) {
            0 => None,
            c => Some(c),
        }
    }
}
