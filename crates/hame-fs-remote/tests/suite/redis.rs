//! `RedisFs` against a real Redis (`HAME_TEST_REDIS_URL`).

use std::sync::Arc;
use std::time::Duration;

use hame_fs::{Filesystem, WriteOptions};
use hame_fs_remote::{RedisFs, RedisOptions};
use pretty_assertions::assert_eq;

use super::support::{self, p};

async fn fs(tag: &str) -> Option<RedisFs> {
    let url = support::service("HAME_TEST_REDIS_URL", "Redis")?;
    Some(
        RedisFs::connect(&url, &support::namespace(tag), RedisOptions::default())
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance() {
    let Some(fs) = fs("conformance").await else {
        return;
    };
    hame_fs::conformance::run_all(&fs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_editors_lose_no_update() {
    let Some(fs) = fs("editors").await else {
        return;
    };
    support::concurrent_editors(Arc::new(fs), 24).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_edit_one_file() {
    // Two connections (two "replicas") on one namespace.
    let Some(url) = support::service("HAME_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let ns = support::namespace("replicas");
    let a = RedisFs::connect(&url, &ns, RedisOptions::default())
        .await
        .unwrap();
    let b = RedisFs::connect(&url, &ns, RedisOptions::default())
        .await
        .unwrap();
    a.write(&p("f"), b"<end>".to_vec(), WriteOptions::default())
        .await
        .unwrap();
    let (ra, rb) = tokio::join!(
        async {
            for i in 0..20 {
                let req = hame_fs::EditRequest {
                    old: "<end>".into(),
                    new: format!("a{i} <end>"),
                    replace_all: false,
                };
                a.edit(&p("f"), &req).await.unwrap();
            }
        },
        async {
            for i in 0..20 {
                let req = hame_fs::EditRequest {
                    old: "<end>".into(),
                    new: format!("b{i} <end>"),
                    replace_all: false,
                };
                b.edit(&p("f"), &req).await.unwrap();
            }
        }
    );
    let ((), ()) = (ra, rb);
    let text = String::from_utf8(b.read_bytes(&p("f")).await.unwrap()).unwrap();
    let count = text.split_whitespace().filter(|w| *w != "<end>").count();
    assert_eq!(count, 40, "{text}");
}

#[tokio::test]
async fn tenants_are_isolated() {
    let Some(url) = support::service("HAME_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let a = RedisFs::connect(
        &url,
        &support::namespace("tenant-a"),
        RedisOptions::default(),
    )
    .await
    .unwrap();
    let b = RedisFs::connect(
        &url,
        &support::namespace("tenant-b"),
        RedisOptions::default(),
    )
    .await
    .unwrap();
    support::tenants_are_isolated(&a, &b).await;
}

#[tokio::test]
async fn append_after_compare_and_set_uses_the_real_content() {
    let Some(fs) = fs("append-cas").await else {
        return;
    };
    let path = p("log.jsonl");
    let v1 = fs
        .write(&path, b"one\n".to_vec(), WriteOptions::create_new())
        .await
        .unwrap();
    fs.append(&path, b"two\n".to_vec(), hame_fs::AppendOptions::default())
        .await
        .unwrap();
    // The stored version is stale after APPEND: v1 must now conflict...
    let stale = fs
        .write(&path, b"x".to_vec(), WriteOptions::if_match(v1))
        .await;
    assert_eq!(
        stale.err().map(|e| e.code()),
        Some(hame_fs::codes::CONFLICT)
    );
    // ...and the version of the appended content must win.
    let current = hame_fs::Version::of(b"one\ntwo\n");
    let v3 = fs
        .write(&path, b"three\n".to_vec(), WriteOptions::if_match(current))
        .await
        .unwrap();
    assert_eq!(v3, hame_fs::Version::of(b"three\n"));
    assert_eq!(fs.read_bytes(&path).await.unwrap(), b"three\n");
}

#[tokio::test]
async fn a_dead_redis_gives_a_clear_error() {
    // Port 1 on loopback: nothing listens there.
    let options = {
        let mut o = RedisOptions::default();
        o.connect_timeout = Duration::from_secs(2);
        o.reconnect_retries = 1;
        o
    };
    let started = tokio::time::timeout(
        Duration::from_secs(60),
        RedisFs::connect("redis://127.0.0.1:1/", "dead", options),
    )
    .await
    .expect("connect must not hang");
    let err = started.expect_err("connecting to a closed port fails");
    assert_eq!(err.code(), hame_fs::codes::BACKEND_ERROR);
    assert!(err.to_string().contains("cannot connect to Redis"), "{err}");
}

#[tokio::test]
async fn open_builds_a_redis_filesystem() {
    let Some(url) = support::service("HAME_TEST_REDIS_URL", "Redis") else {
        return;
    };
    let fs = hame_fs_remote::open(&url, &support::namespace("open"))
        .await
        .unwrap();
    fs.append(
        &p("a/b.txt"),
        b"hi".to_vec(),
        hame_fs::AppendOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(fs.read_bytes(&p("a/b.txt")).await.unwrap(), b"hi");
    assert!(format!("{fs:?}").contains("RedisFs"));
}

/// Kills the server it started when dropped.
struct OwnRedis(std::process::Child);

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_redis_that_dies_after_connecting_gives_errors_not_hangs() {
    if support::service("HAME_TEST_REDIS_URL", "Redis").is_none() {
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let spawned = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut server = match spawned {
        Ok(child) => OwnRedis(child),
        Err(e) => {
            hame_test_env::skip(format_args!("cannot start a private redis-server ({e})"));
            return;
        }
    };
    let options = {
        let mut o = RedisOptions::default();
        o.connect_timeout = Duration::from_secs(1);
        o.response_timeout = Duration::from_secs(2);
        o.reconnect_retries = 1;
        o
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let mut fs = None;
    for _ in 0..100 {
        if let Ok(f) = RedisFs::connect(&url, "dies", options.clone()).await {
            fs = Some(f);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fs = fs.expect("the private redis-server came up");
    fs.write(&p("a"), b"x".to_vec(), WriteOptions::default())
        .await
        .unwrap();
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    for _ in 0..3 {
        let read = tokio::time::timeout(Duration::from_secs(60), fs.read_bytes(&p("a")))
            .await
            .expect("a dead server must not hang a read");
        assert_eq!(
            read.err().map(|e| e.code()),
            Some(hame_fs::codes::BACKEND_ERROR)
        );
    }
}
