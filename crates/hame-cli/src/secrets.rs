//! Keeps hame's secrets away from the commands its shell runs.
//!
//! The `execute` child starts with a minimal environment (`PATH`, `HOME`, `LANG`: see
//! `hame_fs::ShellOptions`), but it could still read hame's own environment through
//! `/proc/<hame pid>/environ` (`cat /proc/$PPID/environ`, `ps eww`). After the agent is
//! built (every credential is read by then), [`seal`]:
//!
//! 1. marks the process non-dumpable (`PR_SET_DUMPABLE 0`): `/proc/<pid>/environ`, `mem`
//!    and friends are then owned by root, so a child running as the same, non-root user
//!    cannot open them, and cannot `ptrace` hame;
//! 2. overwrites, in place, the values of secret variables in the process's initial
//!    environment block (the memory `/proc/<pid>/environ` shows, between `env_start` and
//!    `env_end` of `/proc/self/stat`) with NUL bytes, through `/proc/self/mem`. This holds
//!    even for a child running as root (which the dumpable flag does not stop).
//!
//! A variable is secret when its name is `AWS_*`, or contains `KEY`, `TOKEN`, `SECRET`,
//! `PASSWORD`, `PASSWD` or `CREDENTIAL`, or its value is a URL with a password
//! (`scheme://user:pass@host`).
//!
//! [`register`] puts the same values (but `AWS_*` by name alone) into the redaction
//! registry of `hame::secrets` at start-up, so that a provider's error echoing a key
//! reaches neither a file, a model request nor the terminal (ADR 0023).

use std::io::{Read, Seek, SeekFrom, Write};

/// Whether the variable `name=value` is a secret (see the module docs).
pub(crate) fn is_secret(name: &str, value: &str) -> bool {
    name.to_ascii_uppercase().starts_with("AWS_")
        || hame::secrets::is_secret_name(name)
        || hame::secrets::url_password(value).is_some()
}

/// Registers the values of this process's secret variables in the process's redaction
/// registry (`hame::secrets`), so no text hame stores, sends to a model or prints carries
/// them: names by [`hame::secrets::is_secret_name`] (not every `AWS_*`: a region is no
/// secret worth cutting out of text), and the credentials of every URL with a password.
/// Returns how many values were registered.
pub(crate) fn register() -> usize {
    let mut n = 0;
    for (name, value) in std::env::vars_os() {
        let (name, value) = (name.to_string_lossy(), value.to_string_lossy());
        if hame::secrets::is_secret_name(&name) && hame::secrets::add_secret(&value) {
            n += 1;
        }
        if hame::secrets::add_url(&value) {
            n += 1;
        }
    }
    n
}

/// What [`seal`] did, for the debug log.
#[derive(Debug, Default)]
pub(crate) struct Sealed {
    pub(crate) non_dumpable: bool,
    pub(crate) scrubbed: usize,
}

/// Marks hame non-dumpable and scrubs secret values from its environment block.
pub(crate) fn seal() -> Sealed {
    let non_dumpable =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .is_ok();
    let scrubbed = scrub_environ_block().unwrap_or(0);
    Sealed {
        non_dumpable,
        scrubbed,
    }
}

/// `(env_start, env_end)` from `/proc/self/stat` (fields 50 and 51).
fn env_bounds() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `fields[0]` is field 3 (the state).
    let start = fields.get(50 - 3)?.parse().ok()?;
    let end = fields.get(51 - 3)?.parse().ok()?;
    (end > start).then_some((start, end))
}

fn scrub_environ_block() -> std::io::Result<usize> {
    let Some((start, end)) = env_bounds() else {
        return Ok(0);
    };
    let mut mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    let len = usize::try_from(end - start).map_err(std::io::Error::other)?;
    let mut block = vec![0u8; len];
    mem.seek(SeekFrom::Start(start))?;
    mem.read_exact(&mut block)?;
    let mut scrubbed = 0;
    let mut offset = 0usize;
    for entry in block.split(|b| *b == 0) {
        let here = offset;
        offset += entry.len() + 1;
        let Some(eq) = entry.iter().position(|b| *b == b'=') else {
            continue;
        };
        let name = String::from_utf8_lossy(&entry[..eq]);
        let value = String::from_utf8_lossy(&entry[eq + 1..]);
        if value.is_empty() || !is_secret(&name, &value) {
            continue;
        }
        let at = start + (here + eq + 1) as u64;
        mem.seek(SeekFrom::Start(at))?;
        mem.write_all(&vec![0u8; entry.len() - eq - 1])?;
        scrubbed += 1;
    }
    Ok(scrubbed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_and_urls() {
        for (k, v) in [
            ("OPENAI_API_KEY", "sk-1"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("AWS_REGION", "eu-west-1"),
            ("GITHUB_TOKEN", "x"),
            ("PGPASSWORD", "x"),
            ("HAME_STATE", "redis://u:p@h:6379/0"),
            ("DATABASE_URL", "postgres://hame:pw@127.0.0.1/db"),
        ] {
            assert!(is_secret(k, v), "{k}");
        }
        for (k, v) in [
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("HAME_MODEL", "openai:gpt-4o-mini"),
            ("HAME_STATE", "redis://127.0.0.1:6379/0"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
        ] {
            assert!(!is_secret(k, v), "{k}");
        }
    }
}
