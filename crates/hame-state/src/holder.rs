//! [`Holder`]: who holds a lease, and whether that process is certainly gone.
//!
//! A shared store (Redis, PostgreSQL, MySQL) records the holder of every lease. A caller
//! that finds a session leased by a process of its own machine that no longer runs takes
//! the lease over at once instead of waiting for its TTL. "Its own machine" means the same
//! kernel boot (`/proc/sys/kernel/random/boot_id`) *and* the same PID namespace
//! (`/proc/self/ns/pid`): containers on one host share the boot id but not their PIDs. A
//! PID is the same process only if its start time (`/proc/<pid>/stat` field 22, clock ticks
//! since boot) is unchanged, so a reused PID is not mistaken for the holder.
//!
//! Whenever anything is unknown (no `/proc`, `/proc` mounted with `hidepid`, an unreadable
//! record, another machine) the holder counts as alive and the lease waits for its TTL.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// The process that holds (or held) a lease, as recorded by the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Holder {
    /// Host name (`/proc/sys/kernel/hostname`); informational.
    pub host: String,
    /// Kernel boot id; empty when unknown.
    pub boot_id: String,
    /// PID namespace (`pid:[inode]`); empty when unknown.
    pub pid_ns: String,
    /// Process id.
    pub pid: u32,
    /// Start time of the process in clock ticks after boot; 0 when unknown.
    pub start_time: u64,
}

/// Whether `/proc` tells the truth about other processes here (it does not under
/// `hidepid`, where other users' processes look absent).
static PROC_RELIABLE: LazyLock<bool> = LazyLock::new(|| {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .filter(|l| l.split(' ').nth(4) == Some("/proc"))
            .all(|l| {
                l.split(" - ")
                    .nth(1)
                    .and_then(|sup| sup.split(' ').nth(2))
                    .is_none_or(|opts| {
                        opts.split(',').all(|o| {
                            o.strip_prefix("hidepid=")
                                .is_none_or(|v| v == "0" || v == "off")
                        })
                    })
            })
    })
});

static CURRENT: LazyLock<Holder> = LazyLock::new(|| {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let pid = std::process::id();
    Holder {
        host: read("/proc/sys/kernel/hostname"),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
        pid_ns: std::fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        pid,
        start_time: match proc_stat(pid) {
            Ok(Some(stat)) => stat.start_time,
            _ => 0,
        },
    }
});

/// The parts of `/proc/<pid>/stat` that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), …
    state: char,
    /// Field 22.
    start_time: u64,
}

/// Reads `/proc/<pid>/stat`: `Ok(None)` when there is no such process.
fn proc_stat(pid: u32) -> std::io::Result<Option<ProcStat>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse_stat(&text)
        .map(Some)
        .ok_or_else(|| std::io::Error::other(format!("unreadable /proc/{pid}/stat")))
}

/// Parses a `stat` line. Field 2 (the command) is in parentheses and may contain spaces and
/// parentheses itself, so the fields are counted after its last `)`.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3; field 22 is 19 further on.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

impl Holder {
    /// This process.
    pub fn current() -> &'static Holder {
        &CURRENT
    }

    /// The record as stored: compact JSON.
    #[allow(dead_code)] // unused without a shared store
    pub(crate) fn to_record(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored record; `None` for an empty or foreign one.
    #[allow(dead_code)] // unused without a shared store
    pub(crate) fn from_record(record: &str) -> Option<Holder> {
        serde_json::from_str(record).ok()
    }

    /// Whether this holder is a process of this machine and PID namespace that has
    /// certainly exited (absent, a zombie, or its PID now belongs to a process started at
    /// another time). `false` whenever that cannot be known.
    pub fn is_gone(&self) -> bool {
        let me = Holder::current();
        let comparable = *PROC_RELIABLE
            && !me.boot_id.is_empty()
            && !me.pid_ns.is_empty()
            && self.boot_id == me.boot_id
            && self.pid_ns == me.pid_ns
            && self.start_time != 0;
        if !comparable {
            return false;
        }
        match proc_stat(self.pid) {
            Ok(None) => true,
            Ok(Some(stat)) => {
                matches!(stat.state, 'Z' | 'X' | 'x') || stat.start_time != self.start_time
            }
            Err(_) => false,
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {}", self.pid, self.host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line = "4242 (a b) (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: 'S',
                start_time: 987_654
            })
        );
        assert_eq!(parse_stat("12 (x) S 1 2"), None);
    }

    #[test]
    fn this_process_is_alive_and_identified() {
        let me = Holder::current();
        assert_eq!(me.pid, std::process::id());
        if cfg!(target_os = "linux") {
            assert!(!me.boot_id.is_empty() && !me.pid_ns.is_empty() && me.start_time > 0);
        }
        assert!(!me.is_gone());
        let record = me.to_record();
        assert_eq!(Holder::from_record(&record).as_ref(), Some(me));
        assert_eq!(Holder::from_record(""), None);
    }

    #[test]
    fn a_reused_pid_or_another_machine() {
        let me = Holder::current().clone();
        if !*PROC_RELIABLE || me.start_time == 0 {
            return;
        }
        // Same PID, other start time: the PID was reused, the holder is gone.
        let reused = Holder {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(reused.is_gone());
        // Another boot or PID namespace: unknowable, so alive.
        for other in [
            Holder {
                boot_id: "another-boot".into(),
                start_time: me.start_time + 1,
                ..me.clone()
            },
            Holder {
                pid_ns: "pid:[1]".into(),
                start_time: me.start_time + 1,
                ..me.clone()
            },
            Holder {
                start_time: 0,
                ..me.clone()
            },
        ] {
            assert!(!other.is_gone(), "{other:?}");
        }
    }

    #[test]
    fn an_exited_child_is_gone_even_as_a_zombie() -> std::io::Result<()> {
        if !*PROC_RELIABLE || Holder::current().start_time == 0 {
            return Ok(());
        }
        let mut child = std::process::Command::new("sleep").arg("60").spawn()?;
        let pid = child.id();
        let start_time = proc_stat(pid)?.map_or(0, |s| s.start_time);
        let holder = Holder {
            pid,
            start_time,
            ..Holder::current().clone()
        };
        assert!(!holder.is_gone(), "a running child counts as gone");
        child.kill()?;
        // Not reaped yet: a zombie (give the kernel a moment to finish the kill).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !holder.is_gone() {
            assert!(
                std::time::Instant::now() < deadline,
                "zombie not seen as gone"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait()?;
        assert!(holder.is_gone(), "a reaped child counts as alive");
        Ok(())
    }
}
