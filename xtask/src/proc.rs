//! Running child processes with bounded time, and tiny TCP/HTTP probes for readiness checks.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Human-readable form of a command for logs and errors.
pub fn display(cmd: &Command) -> String {
    let mut out = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        let arg = arg.to_string_lossy();
        out.push(' ');
        if arg.contains(' ') || arg.is_empty() {
            out.push('\'');
            out.push_str(&arg);
            out.push('\'');
        } else {
            out.push_str(&arg);
        }
    }
    out
}

/// Runs `cmd` with inherited stdio and no time limit; fails on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = display(cmd);
    println!("$ {shown}");
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` with inherited stdout/stderr; kills it and fails after `limit`.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<()> {
    let shown = display(cmd);
    println!("$ {shown}");
    let status = wait_bounded(cmd.stdin(Stdio::null()), limit, &shown)?;
    if !status.success() {
        bail!("`{shown}` failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` silently (all stdio null) and reports whether it exited 0 within `limit`.
/// A command that cannot be started or times out counts as `false`.
pub fn succeeds_quietly(cmd: &mut Command, limit: Duration) -> bool {
    let shown = display(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    wait_bounded(cmd, limit, &shown).is_ok_and(|status| status.success())
}

/// Runs `cmd` and returns its stdout; fails on a non-zero exit. Meant for short-lived
/// queries (`cargo metadata`, `pg_lsclusters`), so no time limit.
pub fn capture(cmd: &mut Command) -> Result<String> {
    let shown = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !out.status.success() {
        bail!("`{shown}` failed with {}", out.status);
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{shown}` printed non-UTF-8 output"))
}

fn wait_bounded(cmd: &mut Command, limit: Duration, shown: &str) -> Result<ExitStatus> {
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            // Best effort: the child may have exited between the two calls.
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{shown}` did not finish within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `probe` every 250 ms until it returns `true`; fails with `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut probe: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if probe() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{what} was not ready within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Looks `name` up in `PATH` and the sbin directories (which a non-root `PATH` may lack).
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A command for `program`, resolved through [`find_binary`] when possible.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let program = program.as_ref();
    match program.to_str().and_then(find_binary) {
        Some(path) => Command::new(path),
        None => Command::new(program),
    }
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Sends `PING` to a Redis server and expects `+PONG`.
pub fn redis_ping(addr: SocketAddr) -> bool {
    let reply = (|| -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
        stream.write_all(b"PING\r\n")?;
        let mut buf = [0u8; 16];
        let n = stream.read(&mut buf)?;
        Ok(buf[..n].to_vec())
    })();
    reply.is_ok_and(|r| r.starts_with(b"+PONG"))
}

/// Empties Redis database `db` on `addr` (`SELECT db`, `FLUSHDB`); `true` when both
/// answered `+OK`.
pub fn redis_flushdb(addr: SocketAddr, db: u8) -> bool {
    let reply = (|| -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
        stream.write_all(format!("SELECT {db}\r\nFLUSHDB\r\n").as_bytes())?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 64];
        while buf.windows(2).filter(|w| w == b"\r\n").count() < 2 {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(buf)
    })();
    reply.is_ok_and(|r| r == b"+OK\r\n+OK\r\n")
}

/// Whether something accepts TCP connections on `addr`.
pub fn tcp_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok()
}

/// Sends a body-less HTTP/1.1 request and returns the response status code.
pub fn http_status(addr: SocketAddr, method: &str, path: &str) -> Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    parse_status_line(&String::from_utf8_lossy(&head))
}

/// Extracts the status code from the first line of an HTTP response.
pub fn parse_status_line(response: &str) -> Result<u16> {
    let line = response.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/") => code
            .parse()
            .with_context(|| format!("bad HTTP status line `{line}`")),
        _ => bail!("not an HTTP response: `{line}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn status_line_is_parsed() -> Result<()> {
        assert_eq!(parse_status_line("HTTP/1.1 200 OK\r\nServer: x\r\n")?, 200);
        assert_eq!(parse_status_line("HTTP/1.0 409 Conflict\r\n")?, 409);
        Ok(())
    }

    #[test]
    fn garbage_is_not_a_status_line() {
        assert!(parse_status_line("").is_err());
        assert!(parse_status_line("+PONG\r\n").is_err());
        assert!(parse_status_line("HTTP/1.1 abc\r\n").is_err());
    }

    #[test]
    fn display_quotes_arguments_with_spaces() {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--save", "", "--bind", "127.0.0.1"]);
        assert_eq!(display(&cmd), "redis-server --save '' --bind 127.0.0.1");
    }

    #[test]
    fn bounded_run_kills_a_hanging_child() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let err = run_bounded(&mut cmd, Duration::from_millis(300));
        assert!(err.is_err_and(|e| e.to_string().contains("did not finish")));
    }

    #[test]
    fn quiet_success_reports_exit_status() {
        assert!(succeeds_quietly(
            &mut Command::new("true"),
            Duration::from_secs(10)
        ));
        assert!(!succeeds_quietly(
            &mut Command::new("false"),
            Duration::from_secs(10)
        ));
        assert!(!succeeds_quietly(
            &mut Command::new("/nonexistent/binary"),
            Duration::from_secs(10)
        ));
    }

    #[test]
    fn http_probe_talks_to_a_real_listener() -> Result<()> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let server = std::thread::spawn(move || -> std::io::Result<String> {
            let (mut conn, _) = listener.accept()?;
            let mut buf = [0u8; 1024];
            let n = conn.read(&mut buf)?;
            conn.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")?;
            Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
        });
        assert_eq!(http_status(addr, "PUT", "/hame-test")?, 204);
        let request = server
            .join()
            .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
        assert!(
            request.starts_with("PUT /hame-test HTTP/1.1\r\n"),
            "{request}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod redis_tests {
    /// Needs a Redis on 127.0.0.1:6379 and empties its database 15: run by hand
    /// (`cargo test -p xtask -- --ignored flushdb`).
    #[test]
    #[ignore]
    fn flushdb_empties_its_database() -> std::io::Result<()> {
        use std::io::{Read, Write};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 6379));
        let mut s = std::net::TcpStream::connect(addr)?;
        s.write_all(b"SELECT 15\r\nSET xtask-probe 1\r\n")?;
        let mut buf = [0u8; 32];
        let _ = s.read(&mut buf)?;
        assert!(super::redis_flushdb(addr, 15));
        let mut s = std::net::TcpStream::connect(addr)?;
        s.write_all(b"SELECT 15\r\nDBSIZE\r\n")?;
        std::thread::sleep(std::time::Duration::from_millis(100));
        let n = s.read(&mut buf)?;
        assert_eq!(&buf[..n], b"+OK\r\n:0\r\n");
        Ok(())
    }
}
