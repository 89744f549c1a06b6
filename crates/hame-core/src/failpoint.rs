//! Test-only failpoints: places where a crash test kills the process.
//!
//! With the cargo feature `failpoints` (off by default; `hame-cli --features failpoints`
//! forwards it) a process whose [`FAILPOINT_ENV`] environment variable names a point sends
//! itself `SIGKILL` when it reaches that point: no destructor, no flush, no lease release
//! runs, exactly as if the machine had killed it there. Without the feature [`failpoint`]
//! does nothing and costs nothing. The points are listed in `docs/crash-safety.md`
//! (*Failpoints*); crash tests run `hame run` with `HAME_FAILPOINT=<point>` and check what
//! the next call finds.

/// The environment variable naming the failpoint a test process dies at: `<point>` (its
/// first visit) or `<point>#<n>` (its n-th visit, 1-based: a child's call passes the call
/// points before its parent's).
pub const FAILPOINT_ENV: &str = "HAME_FAILPOINT";

/// Kills this process with `SIGKILL` at the visit of `name` that [`FAILPOINT_ENV`] names,
/// if it is built with the `failpoints` feature; otherwise does nothing.
#[inline]
pub fn failpoint(name: &str) {
    #[cfg(feature = "failpoints")]
    armed::visit(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The armed point and visit, read once.
    fn target() -> Option<&'static (String, u64)> {
        static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
        TARGET
            .get_or_init(|| {
                let v = std::env::var(super::FAILPOINT_ENV).ok()?;
                Some(match v.split_once('#') {
                    Some((name, n)) => (name.to_owned(), n.parse().unwrap_or(1)),
                    None => (v, 1),
                })
            })
            .as_ref()
    }

    pub(super) fn visit(name: &str) {
        static VISITS: AtomicU64 = AtomicU64::new(0);
        let Some((point, nth)) = target() else {
            return;
        };
        if point != name || VISITS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
            return;
        }
        tracing::warn!(failpoint = name, "failpoint reached: killing the process");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should the signal fail, still die without unwinding.
        std::process::abort();
    }
}
