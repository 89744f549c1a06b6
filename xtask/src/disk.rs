//! Disk room for CI: what is free where the build goes, and room made before the steps
//! that need it (a CI machine's disk can be small: a run once failed with `No space left
//! on device` in its last steps).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// `disk: 41.2 GiB free` for the file system of `path` (or its nearest existing parent).
pub fn report(path: &Path) -> String {
    let mut at = path;
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    match free_bytes(at) {
        Some(free) => format!("disk: {:.1} GiB free", free as f64 / f64::from(1u32 << 30)),
        None => "disk: free space unknown".to_owned(),
    }
}

/// Free bytes on the file system of `path`, from `df -Pk` (POSIX output).
fn free_bytes(path: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

/// Removes the test executables of `<target>/debug/deps` (regular files with the exec bit
/// and no extension: `all-0123abcd…`); libraries, metadata and build scripts stay.
/// Returns the bytes freed.
pub fn prune_test_executables(target: &Path) -> Result<u64> {
    let deps = target.join("debug").join("deps");
    let mut freed = 0;
    let entries = match std::fs::read_dir(&deps) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("list {}", deps.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("list {}", deps.display()))?;
        if !is_test_executable(&entry.file_name().to_string_lossy(), &entry.metadata()?) {
            continue;
        }
        let len = entry.metadata()?.len();
        std::fs::remove_file(entry.path())
            .with_context(|| format!("remove {}", entry.path().display()))?;
        freed += len;
    }
    Ok(freed)
}

fn is_test_executable(name: &str, meta: &std::fs::Metadata) -> bool {
    meta.is_file() && !name.contains('.') && meta.permissions().mode() & 0o111 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_extensionless_executables_are_pruned() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-prune-{}", std::process::id()));
        let deps = dir.join("debug").join("deps");
        std::fs::create_dir_all(&deps)?;
        let put = |name: &str, mode: u32| -> Result<()> {
            let p = deps.join(name);
            std::fs::write(&p, b"0123456789")?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
            Ok(())
        };
        put("all-0a1b2c", 0o755)?;
        put("libhame-0a1b2c.rlib", 0o644)?;
        put("libmacro-0a1b2c.so", 0o755)?;
        put("hame-0a1b2c.d", 0o644)?;
        put("notes-0a1b2c", 0o644)?;
        let freed = prune_test_executables(&dir)?;
        let mut left: Vec<String> = std::fs::read_dir(&deps)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        left.sort();
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(freed, 10);
        assert_eq!(
            left,
            [
                "hame-0a1b2c.d",
                "libhame-0a1b2c.rlib",
                "libmacro-0a1b2c.so",
                "notes-0a1b2c"
            ]
        );
        assert!(report(&dir).starts_with("disk: "));
        Ok(())
    }
}
