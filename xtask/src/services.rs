//! Installing, starting and probing the services the test suites talk to.
//!
//! Every step is idempotent: a service that already answers is left alone (it may belong to
//! another developer), a package whose binary exists is not reinstalled.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::proc::{self, command, find_binary};

/// Everything the tests may be pointed at, as `cargo xtask env` prints it.
pub const TEST_ENV: [(&str, &str); 5] = [
    ("HAME_TEST_REDIS_URL", REDIS_URL),
    ("HAME_TEST_POSTGRES_URL", POSTGRES_URL),
    ("HAME_TEST_MYSQL_URL", MYSQL_URL),
    ("HAME_TEST_S3_ENDPOINT", S3_ENDPOINT),
    ("HAME_TEST_DOCKER", "1"),
];

/// The tests' own database, never 0 (the README's examples use 1): `cargo xtask ci` empties
/// it after the tests.
pub const REDIS_TEST_DB: u8 = 15;
const REDIS_URL: &str = "redis://127.0.0.1:6379/15";
const POSTGRES_URL: &str = "postgres://postgres:postgres@127.0.0.1:5432/postgres";
const MYSQL_URL: &str = "mysql://test:test@127.0.0.1:3306/test";
const S3_ENDPOINT: &str = "http://127.0.0.1:5000";
/// The bucket the S3 tests use; created on the moto server.
pub const S3_BUCKET: &str = "hame-test";

const REDIS_ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 6379);
const MYSQL_ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 3306);
const MOTO_ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 5000);

/// Debian packages installed when one of their binaries is missing.
const APT_PACKAGES: [&str; 6] = [
    "redis-server",
    "postgresql",
    "mariadb-server",
    "ripgrep",
    "busybox-static",
    // Headless browser for the web console test of `hame serve`.
    "chromium",
];
/// Binaries whose presence means the packages above are installed.
const APT_BINARIES: [&str; 7] = [
    "redis-server",
    "pg_ctlcluster",
    "mariadbd",
    "rg",
    "busybox",
    "pg_isready",
    "chromium",
];
/// moto is pinned to its major version so a new major cannot change behaviour under us.
const MOTO_REQUIREMENT: &str = "moto[server]>=5,<6";

const APT_UPDATE_LIMIT: Duration = Duration::from_secs(300);
const APT_INSTALL_LIMIT: Duration = Duration::from_secs(900);
const PIP_INSTALL_LIMIT: Duration = Duration::from_secs(600);
const START_LIMIT: Duration = Duration::from_secs(120);
const READY_LIMIT: Duration = Duration::from_secs(60);
const QUERY_LIMIT: Duration = Duration::from_secs(30);

/// Where service state (logs, the moto venv) lives and how strict to be.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Directory for logs and the moto virtualenv (`<target>/xtask/services`).
    pub state_dir: PathBuf,
    /// In CI every service must come up; locally a failing one is reported and skipped.
    pub require_all: bool,
    /// Build the default sandbox image once Docker answers (`cargo run` of `hame sandbox
    /// image`). `cargo xtask ci` leaves it to its nextest step, which runs the `hame` its
    /// own test build made ([`build_sandbox_image_with`]) instead of building the CLI a
    /// second time with other features.
    pub sandbox_image: bool,
}

impl ServiceOptions {
    /// State under the workspace `target/`, strictness from `CI`.
    pub fn from_env(root: &Path) -> Result<Self> {
        let target = crate::target_dir(root);
        let state_dir = target.join("xtask").join("services");
        fs::create_dir_all(&state_dir)
            .with_context(|| format!("create {}", state_dir.display()))?;
        Ok(Self {
            state_dir,
            require_all: hame_test_env::ci(),
            sandbox_image: true,
        })
    }
}

/// The environment variables for the services that are up.
#[derive(Debug, Clone, Default)]
pub struct ServiceEnv {
    vars: Vec<(&'static str, &'static str)>,
}

impl ServiceEnv {
    /// `(name, value)` pairs to set on test processes.
    pub fn vars(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.vars.iter().copied()
    }
}

type Starter = fn(&ServiceOptions) -> Result<()>;

/// Installs what is missing and starts every service; returns the variables for the ones
/// that are ready. With `require_all`, any failure is an error.
pub fn start_all(options: &ServiceOptions) -> Result<ServiceEnv> {
    let mut failures = Vec::new();
    if let Err(err) = install_packages() {
        if options.require_all {
            return Err(err);
        }
        eprintln!("warning: {err:#}");
    }
    let services: [(&str, &str, Starter); 5] = [
        ("redis", "HAME_TEST_REDIS_URL", start_redis),
        ("postgresql", "HAME_TEST_POSTGRES_URL", start_postgres),
        ("mariadb", "HAME_TEST_MYSQL_URL", start_mariadb),
        ("moto s3", "HAME_TEST_S3_ENDPOINT", start_moto),
        ("docker", "HAME_TEST_DOCKER", start_docker),
    ];
    let mut env = ServiceEnv::default();
    for (name, var, start) in services {
        let started = Instant::now();
        match start(options) {
            Ok(()) => {
                println!(
                    "service {name}: ready ({:.1} s)",
                    started.elapsed().as_secs_f64()
                );
                if let Some(pair) = TEST_ENV.iter().find(|(key, _)| *key == var) {
                    env.vars.push(*pair);
                }
            }
            Err(err) => {
                eprintln!("service {name}: FAILED: {err:#}");
                failures.push(format!("{name}: {err:#}"));
            }
        }
    }
    if !failures.is_empty() {
        if options.require_all {
            bail!(
                "{} service(s) could not be started (CI is set: all are required):\n  {}",
                failures.len(),
                failures.join("\n  ")
            );
        }
        eprintln!(
            "warning: {} service(s) unavailable; their tests will print SKIPPED",
            failures.len()
        );
    }
    Ok(env)
}

fn install_packages() -> Result<()> {
    let mut missing: Vec<&str> = APT_BINARIES
        .into_iter()
        .filter(|bin| find_binary(bin).is_none())
        .collect();
    if !postgres_server_installed() {
        missing.push("postgres (server)");
    }
    if missing.is_empty() {
        println!("packages: all present, skipping apt-get");
        return Ok(());
    }
    println!("packages: missing {}", missing.join(", "));
    apt_install(&APT_PACKAGES)
}

fn apt_install(packages: &[&str]) -> Result<()> {
    if !is_root() {
        bail!(
            "missing packages and not running as root; run: sudo apt-get install -y {}",
            packages.join(" ")
        );
    }
    proc::run_bounded(
        command("apt-get")
            .arg("update")
            .env("DEBIAN_FRONTEND", "noninteractive"),
        APT_UPDATE_LIMIT,
    )?;
    proc::run_bounded(
        command("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        APT_INSTALL_LIMIT,
    )?;
    // The downloaded .deb files are installed now; CI's disk can be small.
    if let Err(e) = proc::run_bounded(command("apt-get").arg("clean"), APT_UPDATE_LIMIT) {
        eprintln!("warning: apt-get clean: {e:#}");
    }
    Ok(())
}

fn is_root() -> bool {
    proc::capture(command("id").arg("-u")).is_ok_and(|uid| uid.trim() == "0")
}

fn postgres_server_installed() -> bool {
    installed_postgres_versions().is_ok_and(|v| !v.is_empty())
}

/// Major versions with a server binary under `/usr/lib/postgresql/<v>/bin/postgres`.
fn installed_postgres_versions() -> Result<Vec<String>> {
    let mut versions = Vec::new();
    for entry in fs::read_dir("/usr/lib/postgresql")? {
        let entry = entry?;
        if entry.path().join("bin").join("postgres").is_file() {
            versions.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    versions.sort_by_key(|v| v.parse::<u32>().unwrap_or(0));
    Ok(versions)
}

// ---------------------------------------------------------------- Redis

fn start_redis(options: &ServiceOptions) -> Result<()> {
    let addr = SocketAddr::from(REDIS_ADDR);
    if proc::redis_ping(addr) {
        println!("redis: already answering on {addr}");
        return Ok(());
    }
    let log = options.state_dir.join("redis.log");
    proc::run_bounded(
        command("redis-server")
            .args([
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "--port",
                "6379",
            ])
            .args(["--save", "", "--appendonly", "no", "--logfile"])
            .arg(&log),
        START_LIMIT,
    )?;
    proc::wait_until("redis", READY_LIMIT, || proc::redis_ping(addr))
        .with_context(|| format!("see {}", log.display()))
}

// ---------------------------------------------------------------- PostgreSQL

/// One row of `pg_lsclusters --no-header`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgCluster {
    /// Major version, e.g. `15`.
    pub version: String,
    /// Cluster name, e.g. `main`.
    pub name: String,
    /// TCP port.
    pub port: u16,
    /// `online` or `down` (possibly with a suffix such as `online,recovery`).
    pub status: String,
}

/// Parses `pg_lsclusters --no-header` output.
pub fn parse_pg_lsclusters(text: &str) -> Vec<PgCluster> {
    text.lines()
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let version = cols.next()?.to_owned();
            let name = cols.next()?.to_owned();
            let port = cols.next()?.parse().ok()?;
            let status = cols.next()?.to_owned();
            Some(PgCluster {
                version,
                name,
                port,
                status,
            })
        })
        .collect()
}

fn pg_ready() -> bool {
    proc::succeeds_quietly(
        command("pg_isready").args(["-q", "-h", "127.0.0.1", "-p", "5432"]),
        Duration::from_secs(5),
    )
}

fn start_postgres(_options: &ServiceOptions) -> Result<()> {
    if pg_ready() {
        println!("postgresql: already answering on 127.0.0.1:5432");
    } else {
        let listing = proc::capture(command("pg_lsclusters").arg("--no-header"))?;
        let clusters = parse_pg_lsclusters(&listing);
        let cluster = match clusters.into_iter().find(|c| c.port == 5432) {
            Some(cluster) => cluster,
            None => {
                let version = installed_postgres_versions()?
                    .pop()
                    .context("no PostgreSQL server under /usr/lib/postgresql")?;
                proc::run_bounded(
                    command("pg_createcluster").args([&version, "main", "--port", "5432"]),
                    START_LIMIT,
                )?;
                PgCluster {
                    version,
                    name: "main".into(),
                    port: 5432,
                    status: "down".into(),
                }
            }
        };
        proc::run_bounded(
            command("pg_ctlcluster").args([&cluster.version, &cluster.name, "start"]),
            START_LIMIT,
        )
        .with_context(|| {
            format!(
                "see /var/log/postgresql/postgresql-{}-{}.log",
                cluster.version, cluster.name
            )
        })?;
        proc::wait_until("postgresql", READY_LIMIT, pg_ready)?;
    }
    if !is_root() {
        println!("postgresql: not root, assuming the password of `postgres` is already set");
        return Ok(());
    }
    proc::run_bounded(
        command("su").args([
            "postgres",
            "-c",
            "psql -q -v ON_ERROR_STOP=1 -c \"ALTER USER postgres PASSWORD 'postgres'\"",
        ]),
        QUERY_LIMIT,
    )
    .context("set the password of the postgres role")
}

// ---------------------------------------------------------------- MariaDB

fn mariadb_ready() -> bool {
    proc::succeeds_quietly(
        command("mariadb-admin").args(["--silent", "ping"]),
        Duration::from_secs(5),
    ) || proc::tcp_open(SocketAddr::from(MYSQL_ADDR))
}

const MARIADB_SETUP: &str = "CREATE DATABASE IF NOT EXISTS test; \
     CREATE USER IF NOT EXISTS 'test'@'127.0.0.1' IDENTIFIED BY 'test'; \
     CREATE USER IF NOT EXISTS 'test'@'localhost' IDENTIFIED BY 'test'; \
     GRANT ALL ON *.* TO 'test'@'127.0.0.1'; \
     GRANT ALL ON *.* TO 'test'@'localhost'; \
     FLUSH PRIVILEGES;";

fn start_mariadb(_options: &ServiceOptions) -> Result<()> {
    if mariadb_ready() {
        println!("mariadb: already answering");
    } else {
        let started = proc::run_bounded(command("service").args(["mariadb", "start"]), START_LIMIT);
        if let Err(err) = started {
            eprintln!("mariadb: `service mariadb start` failed ({err:#}); trying init.d");
            proc::run_bounded(
                Command::new("/etc/init.d/mariadb").arg("start"),
                START_LIMIT,
            )?;
        }
        proc::wait_until("mariadb", READY_LIMIT, mariadb_ready)?;
    }
    if !is_root() {
        println!("mariadb: not root, assuming database and user `test` exist");
        return Ok(());
    }
    proc::wait_until("mariadb setup", READY_LIMIT, || {
        proc::succeeds_quietly(command("mariadb").args(["-e", MARIADB_SETUP]), QUERY_LIMIT)
    })
    .context("create database and user `test` (mariadb -e ... as root)")
}

// ---------------------------------------------------------------- moto (S3)

fn moto_answers(addr: SocketAddr) -> bool {
    proc::http_status(addr, "GET", "/").is_ok()
}

/// Where the pid of the moto server this tool started is kept, outside any checkout: a
/// server started from a checkout that was deleted since keeps the port and answers 500.
fn moto_pid_file() -> PathBuf {
    std::env::temp_dir().join("hame-xtask-moto.pid")
}

/// Stops the moto server this tool started, if its pid file names a running
/// `moto_server`; says whether it did.
fn stop_started_moto(addr: SocketAddr) -> Result<bool> {
    let Ok(text) = fs::read_to_string(moto_pid_file()) else {
        return Ok(false);
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return Ok(false);
    };
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains("moto_server") {
        return Ok(false);
    }
    proc::run_bounded(Command::new("kill").arg(pid.to_string()), START_LIMIT)?;
    proc::wait_until("moto to stop", READY_LIMIT, || !moto_answers(addr))?;
    let _ = fs::remove_file(moto_pid_file());
    Ok(true)
}

fn start_moto(options: &ServiceOptions) -> Result<()> {
    let addr = SocketAddr::from(MOTO_ADDR);
    let path = format!("/{S3_BUCKET}");
    // A server that answers but cannot create a bucket (its files are gone) is replaced.
    if moto_answers(addr) && proc::http_status(addr, "PUT", &path).is_ok_and(|s| s >= 500) {
        if stop_started_moto(addr)? {
            println!("moto: the server on {addr} answered HTTP 500; stopped it");
        } else {
            bail!(
                "something on {addr} answers HTTP 500 to creating a bucket and is not a moto \
                 server this tool started: stop it and run again"
            );
        }
    }
    if moto_answers(addr) {
        println!("moto: already answering on {addr}");
    } else {
        let venv = options.state_dir.join("moto-venv");
        let server = venv.join("bin").join("moto_server");
        if !server.is_file() {
            install_moto(&venv)?;
        }
        let log_path = options.state_dir.join("moto.log");
        let log =
            File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;
        let mut cmd = Command::new(&server);
        cmd.args(["-H", "127.0.0.1", "-p", "5000"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Own process group: a Ctrl-C in the terminal must not take the server down.
            .process_group(0);
        println!("$ {} &", proc::display(&cmd));
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", server.display()))?;
        if let Err(e) = fs::write(moto_pid_file(), child.id().to_string()) {
            eprintln!("moto: writing {} failed: {e}", moto_pid_file().display());
        }
        proc::wait_until("moto", READY_LIMIT, || moto_answers(addr))
            .with_context(|| format!("see {}", log_path.display()))?;
    }
    let status = proc::http_status(addr, "PUT", &path)?;
    if !(status == 200 || status == 409) {
        bail!("creating bucket {S3_BUCKET} returned HTTP {status}");
    }
    Ok(())
}

fn install_moto(venv: &Path) -> Result<()> {
    let venv_created = proc::run_bounded(
        command("python3").args(["-m", "venv"]).arg(venv),
        START_LIMIT,
    );
    if let Err(err) = venv_created {
        eprintln!("moto: python3 -m venv failed ({err:#}); installing python3-venv");
        apt_install(&["python3-venv"])?;
        proc::run_bounded(
            Command::new("/usr/bin/python3")
                .args(["-m", "venv"])
                .arg(venv),
            START_LIMIT,
        )?;
    }
    proc::run_bounded(
        Command::new(venv.join("bin").join("pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            // No second copy of every wheel in ~/.cache/pip: CI's disk can be small.
            "--no-cache-dir",
            // Byte-compiling all of moto's services costs CPU the build needs; the few
            // modules the S3 server imports are compiled on first use instead.
            "--no-compile",
            MOTO_REQUIREMENT,
        ]),
        PIP_INSTALL_LIMIT,
    )
}

// ---------------------------------------------------------------- Docker

fn docker_answers() -> bool {
    proc::succeeds_quietly(command("docker").arg("info"), Duration::from_secs(20))
}

fn start_docker(options: &ServiceOptions) -> Result<()> {
    if docker_answers() {
        println!("docker: engine already answering");
    } else {
        start_dockerd(options)?;
    }
    if options.sandbox_image {
        build_sandbox_image()
    } else {
        println!("docker: the sandbox image is built later, by the test build's `hame`");
        Ok(())
    }
}

/// [`build_sandbox_image`] with an already built `hame` binary.
pub fn build_sandbox_image_with(hame: &Path) -> Result<()> {
    let mut cmd = Command::new(hame);
    cmd.args(["sandbox", "image"]);
    proc::run_bounded(&mut cmd, START_LIMIT * 5).context("build the sandbox image")
}

/// The default sandbox image (`hame-sandbox:busybox-1`), built offline from Debian's
/// busybox-static (installed above) by the same code as `hame sandbox image`, so the
/// Docker suites reuse one image.
fn build_sandbox_image() -> Result<()> {
    let mut cmd = command(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args([
        "run", "--quiet", "-p", "hame-cli", "--bin", "hame", "--", "sandbox", "image",
    ]);
    proc::run_bounded(&mut cmd, START_LIMIT * 5).context("build the sandbox image")
}

fn start_dockerd(options: &ServiceOptions) -> Result<()> {
    if find_binary("dockerd").is_none() {
        apt_install(&["docker.io"])?;
    }
    let log_path = options.state_dir.join("dockerd.log");
    let log = File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;
    let mut cmd = command("dockerd");
    cmd.args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    println!("$ {} &", proc::display(&cmd));
    cmd.spawn().context("start dockerd")?;
    proc::wait_until("docker engine", READY_LIMIT, docker_answers)
        .with_context(|| format!("see {}", log_path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn lsclusters_output_is_parsed() {
        let text = "15  main    5432 online postgres /var/lib/postgresql/15/main /var/log/postgresql/postgresql-15-main.log\n\
                    16  test    5433 down   postgres /var/lib/postgresql/16/test /var/log/x.log\n\
                    garbage\n";
        assert_eq!(
            parse_pg_lsclusters(text),
            vec![
                PgCluster {
                    version: "15".into(),
                    name: "main".into(),
                    port: 5432,
                    status: "online".into(),
                },
                PgCluster {
                    version: "16".into(),
                    name: "test".into(),
                    port: 5433,
                    status: "down".into(),
                },
            ]
        );
    }

    #[test]
    fn env_names_match_what_the_tests_read() {
        let names: Vec<&str> = TEST_ENV.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            vec![
                "HAME_TEST_REDIS_URL",
                "HAME_TEST_POSTGRES_URL",
                "HAME_TEST_MYSQL_URL",
                "HAME_TEST_S3_ENDPOINT",
                "HAME_TEST_DOCKER",
            ]
        );
    }
}
