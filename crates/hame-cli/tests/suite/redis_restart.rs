//! Store mode rides out a Redis restart: a private `redis-server` (its own port, AOF with
//! `appendfsync always`, so a restart loses nothing) is killed and started again for about
//! a second while the model is answering; the call succeeds, and its reply is in the session
//! log and in the state exactly once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;

use super::common::{hame, output, run_with, stderr, stdout, unique_agent};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A `redis-server` of this test alone.
struct PrivateRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl PrivateRedis {
    /// Starts one on a free port, or `None` (a loud skip; a failure under CI) when
    /// `redis-server` is not installed.
    fn start() -> Result<Option<Self>, Box<dyn std::error::Error>> {
        if Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_err()
        {
            hame_test_env::skip(
                "redis-server is not installed, so the Redis restart test did not run",
            );
            return Ok(None);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut redis = Self {
            port,
            dir: tempfile::tempdir()?,
            child: None,
        };
        redis.spawn()?;
        Ok(Some(redis))
    }

    fn spawn(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGKILL, as a crash or a forced restart.
    fn kill(&mut self) -> std::io::Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_second_redis_restart_during_a_call_in_store_mode_loses_nothing() -> TestResult {
    let Some(mut redis) = PrivateRedis::start()? else {
        return Ok(());
    };
    let url = redis.url();
    let server = ScriptedServer::start().await?;
    const REPLY: &str = "REPLY-THAT-OUTLIVED-A-RESTART";
    // The model answers after 0.8 s; Redis is down from about 0.2 s to 1.2 s into that, so
    // the reply comes while it is down and its log append and the save wait for it.
    server.push(ScriptStep::text(REPLY).with_delay(Duration::from_millis(800)));
    server.push(ScriptStep::text("second reply"));
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("ws"))?;
    let ws = dir.path().join("ws").to_string_lossy().into_owned();
    let agent = unique_agent();
    let args = [
        "--workspace",
        ws.as_str(),
        "--agent",
        agent.as_str(),
        "--store",
        url.as_str(),
        "--state",
        url.as_str(),
    ];
    let base = server.base_url();
    let call = {
        let (dir, base, args) = (
            dir.path().to_path_buf(),
            base.clone(),
            args.map(str::to_owned),
        );
        tokio::spawn(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_with(&dir, &base, &args, "hello", &[]).await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.requests().is_empty() {
        assert!(Instant::now() < deadline, "the model was never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis.kill()?;
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.spawn()?;
    eprintln!(
        "FIGURE redis was down for {} ms",
        down.elapsed().as_millis()
    );
    let out = call.await??;
    eprintln!(
        "FIGURE the call ended {} ms after Redis went down",
        down.elapsed().as_millis()
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{REPLY}\n"));

    // The log (read back through the CLI from the restarted Redis) holds the reply once.
    let show = output(hame(
        &[
            "sessions",
            "show",
            "default",
            "--json",
            "--workspace",
            &ws,
            "--agent",
            &agent,
            "--store",
            &url,
            "--state",
            &url,
        ],
        &[],
        dir.path(),
    ))
    .await?;
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    assert_eq!(stdout(&show).matches(REPLY).count(), 1, "{}", stdout(&show));
    // So does the state: the next call's request carries it once.
    let next = run_with(dir.path(), &base, &args, "again", &[]).await?;
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    let last = server.requests().last().map(|r| r.body.to_string());
    assert_eq!(last.unwrap_or_default().matches(REPLY).count(), 1);
    assert!(redis.data_dir().exists());
    Ok(())
}
