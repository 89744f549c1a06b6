//! [`RedisFs`]: files as Redis keys under a namespace.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt, stream};
use hame_fs::generic::{self, GrepSearch};
use hame_fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, Error, FileInfo, FileKind, Filesystem,
    FsPath, GlobOutput, GlobRequest, GrepOutput, GrepRequest, ListRequest, Listing, RenameOptions,
    Result, Version, WriteMode, WriteOptions,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::RedisOptions;
use crate::retry::backoff;

/// The one Lua script behind every mutation (see `redis.lua` for the key layout).
const SCRIPT: &str = include_str!("redis.lua");

/// How many scripts run at once in bulk operations (recursive delete, directory rename).
const BULK_CONCURRENCY: usize = 16;
/// How many file contents one grep round trip fetches.
const GREP_BATCH: usize = 64;

/// A filesystem stored in Redis.
///
/// # Key layout
///
/// Every key starts with `<key_prefix>:{<namespace>}:` (the braces are a hash tag, so all
/// keys of one namespace live in one cluster slot):
///
/// | key | type | holds |
/// |---|---|---|
/// | `f:<path>` | string | the file's bytes |
/// | `m:<path>` | hash | `v` (SHA-256 version, when known), `g` (generation), `t` (modified, ms) |
/// | `d:<dir>` | sorted set | names of the directory's children (`d:` alone is the root) |
/// | `idx` | sorted set | every file path, for subtree range reads |
/// | `gen` | counter | the last generation handed out |
///
/// # Atomicity
///
/// Each `write`, `append`, single-file `delete` and file `rename` is one Lua script: the
/// directory index changes with the content, and [`WriteMode::CreateNew`] /
/// [`WriteMode::IfMatch`] are checked inside the script, so exactly one of two racing
/// replicas wins and the other gets `already_exists` / `conflict`. `append` is a native
/// `APPEND` (O(appended bytes)); it clears the stored SHA-256, so the next `IfMatch`
/// compares against the content read together with its generation. `edit` reads content and
/// generation in one step, applies the replacement and writes only if the generation is
/// unchanged; on a race it re-applies the same replacement to the fresh content, up to
/// [`RedisOptions::edit_retries`] times, then reports `conflict`.
///
/// Recursive `delete` and directory `rename` run one script per file: each file moves
/// atomically, the tree as a whole does not.
///
/// Listing uses `ZSCAN` with a `COUNT` hint; grep and glob read the `idx` range of the
/// subtree page by page (never `KEYS`). `list_many` is one read-only run of the script:
/// every listing of the batch in one round trip, all of one moment (the server runs
/// nothing else meanwhile, about a microsecond per entry; cap large listings with
/// `max_results`). A dead server gives `backend_error` after the
/// connect / response timeouts.
#[derive(Clone)]
pub struct RedisFs {
    conn: ConnectionManager,
    /// How a command whose connection broke is sent again (`RedisOptions::retry_window`).
    retry: hame_redis::RetryPolicy,
    prefix: String,
    namespace: String,
    options: RedisOptions,
    script: Arc<redis::Script>,
}

impl fmt::Debug for RedisFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFs")
            .field("prefix", &self.prefix)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Most entries a `list_many` listing asks the script for; past it, no cap is sent.
const LIST_CAP_MAX: usize = 1 << 40;

/// A script reply: `ok` with values, or an error code with its argument.
enum Reply {
    Ok(Vec<Vec<u8>>),
    Err(String, String),
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn vpath(p: &str) -> String {
    format!("/{p}")
}

fn now_ms() -> String {
    Utc::now().timestamp_millis().to_string()
}

fn parse_ms(t: Option<String>) -> Option<DateTime<Utc>> {
    t.and_then(|t| t.parse::<i64>().ok())
        .and_then(DateTime::from_timestamp_millis)
}

fn describe(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connection_refusal() {
        "connection refused".into()
    } else if e.is_connection_dropped() {
        "connection lost".into()
    } else {
        e.to_string()
    }
}

fn redis_error(what: &str, e: redis::RedisError) -> Error {
    Error::backend(format!("redis {what} failed: {}", describe(&e)), e)
}

/// Maps a script error code to the semantic error.
fn code_error(code: &str, arg: &str, path: &FsPath) -> Error {
    match code {
        "is_directory" => Error::IsDirectory { path: vpath(arg) },
        "not_a_directory" => Error::NotADirectory { path: vpath(arg) },
        "already_exists" => Error::AlreadyExists { path: vpath(arg) },
        "not_found" => Error::NotFound { path: vpath(arg) },
        "conflict" => Error::Conflict {
            path: path.to_string(),
            reason: arg.to_owned(),
        },
        other => Error::Backend {
            message: format!("unexpected reply {other:?} from the RedisFs script"),
            source: None,
        },
    }
}

impl RedisFs {
    /// Connects to `url` (`redis://[user:password@]host[:port][/db]`) and keeps files under
    /// `namespace`. Fails with `backend_error` when the server does not answer within
    /// [`RedisOptions::connect_timeout`] (times the reconnect attempts).
    pub async fn connect(url: &str, namespace: &str, options: RedisOptions) -> Result<Self> {
        crate::validate_namespace(namespace)?;
        if options.key_prefix.contains(['{', '}']) {
            return Err(Error::invalid_argument(
                "the Redis key prefix must not contain `{` or `}`",
            ));
        }
        // The URL may carry a password: it is never echoed.
        let client = redis::Client::open(url).map_err(|_| {
            Error::invalid_argument(
                "invalid Redis URL; expected redis://[user:password@]host[:port][/db]",
            )
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(options.reconnect_retries)
            .set_max_delay(std::time::Duration::from_secs(1));
        // A hang guard on top of the client's own timeouts.
        let guard = options
            .connect_timeout
            .saturating_mul(u32::try_from(options.reconnect_retries + 1).unwrap_or(u32::MAX))
            .saturating_add(std::time::Duration::from_secs(5));
        let conn =
            match tokio::time::timeout(guard, ConnectionManager::new_with_config(client, config))
                .await
            {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    return Err(Error::backend(
                        format!("cannot connect to Redis: {}", describe(&e)),
                        e,
                    ));
                }
                Err(_) => {
                    return Err(Error::Backend {
                        message: format!("cannot connect to Redis: no answer within {guard:?}"),
                        source: None,
                    });
                }
            };
        let retry = hame_redis::RetryPolicy {
            window: options.retry_window,
            ..hame_redis::RetryPolicy::default()
        };
        let fs = RedisFs {
            conn,
            retry,
            prefix: format!("{}:{{{namespace}}}:", options.key_prefix),
            namespace: namespace.to_owned(),
            options,
            script: Arc::new(redis::Script::new(SCRIPT)),
        };
        let mut conn = fs.conn.clone();
        fs.script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map_err(|e| redis_error("SCRIPT LOAD", e))?;
        tracing::debug!(namespace, "RedisFs connected");
        Ok(fs)
    }

    /// The namespace the files live under.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn key(&self, kind: &str, path: &str) -> String {
        format!("{}{kind}:{path}", self.prefix)
    }

    /// Sends a read (a command or a pipeline) or a script call, again after a broken
    /// connection (`RedisOptions::retry_window`).
    async fn send<T: redis::FromRedisValue + Send>(
        &self,
        what: &str,
        call: hame_redis::Call<'_>,
    ) -> Result<T> {
        hame_redis::send(&self.conn, &self.retry, what, call)
            .await
            .map_err(|e| redis_error(what, e))
    }

    /// One read command ([`send`](Self::send)).
    async fn query<T: redis::FromRedisValue + Send>(
        &self,
        what: &str,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        self.send(what, hame_redis::Call::Cmd(cmd)).await
    }

    /// Runs one operation of the script. A mutation carries a fresh write id, so sending
    /// it again after a broken connection (whose reply may have been lost after the server
    /// applied it) never applies it twice: the script answers the retry as it answered
    /// the first run.
    async fn run(&self, op: &str, args: &[&[u8]]) -> Result<Reply> {
        let write_id = if op == "read" {
            String::new()
        } else {
            uuid::Uuid::new_v4().simple().to_string()
        };
        self.run_as(op, &write_id, args).await
    }

    /// [`run`](Self::run) under a given write id (`""` for the read).
    async fn run_as(&self, op: &str, write_id: &str, args: &[&[u8]]) -> Result<Reply> {
        let mut inv = self.script.prepare_invoke();
        inv.arg(op).arg(&self.prefix).arg(write_id);
        for a in args {
            inv.arg(*a);
        }
        let mut reply: Vec<Vec<u8>> = self.send(op, hame_redis::Call::Script(&inv)).await?;
        if reply.first().map(Vec::as_slice) == Some(b"ok") {
            reply.remove(0);
            return Ok(Reply::Ok(reply));
        }
        let code = reply.first().map(|c| text(c)).unwrap_or_default();
        let arg = reply.get(1).map(|c| text(c)).unwrap_or_default();
        Ok(Reply::Err(code, arg))
    }

    /// Content and generation, in one atomic step.
    async fn read_with_generation(&self, path: &FsPath) -> Result<(Vec<u8>, Vec<u8>)> {
        match self.run("read", &[path.as_str().as_bytes()]).await? {
            Reply::Ok(mut v) if v.len() == 2 => {
                let generation = v.pop().unwrap_or_default();
                let data = v.pop().unwrap_or_default();
                Ok((data, generation))
            }
            Reply::Ok(_) => Err(code_error("?", "", path)),
            Reply::Err(code, arg) => Err(code_error(&code, &arg, path)),
        }
    }

    async fn write_script(
        &self,
        path: &FsPath,
        mode: &str,
        expected: &[u8],
        data: &[u8],
        version: &Version,
    ) -> Result<Reply> {
        self.run(
            "write",
            &[
                path.as_str().as_bytes(),
                mode.as_bytes(),
                expected,
                data,
                version.as_str().as_bytes(),
                now_ms().as_bytes(),
            ],
        )
        .await
    }

    async fn is_dir(&self, path: &FsPath) -> Result<bool> {
        if path.is_root() {
            return Ok(true);
        }
        self.query(
            "EXISTS",
            redis::cmd("EXISTS").arg(self.key("d", path.as_str())),
        )
        .await
    }

    /// One page of file paths strictly below `base` (or everything for the root), after
    /// `after`, in path order.
    async fn subtree_page(&self, base: &FsPath, after: Option<&str>) -> Result<Vec<String>> {
        let (min, max) = if base.is_root() {
            ("-".to_owned(), "+".to_owned())
        } else {
            (
                format!("[{}/", base.as_str()),
                format!("({}0", base.as_str()),
            )
        };
        let min = after.map_or(min, |a| format!("({a}"));
        self.query(
            "ZRANGEBYLEX",
            redis::cmd("ZRANGEBYLEX")
                .arg(format!("{}idx", self.prefix))
                .arg(min)
                .arg(max)
                .arg("LIMIT")
                .arg(0)
                .arg(self.options.scan_count.max(1)),
        )
        .await
    }

    /// Every file path strictly below `base`, in path order.
    async fn subtree(&self, base: &FsPath) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        loop {
            let page = self
                .subtree_page(base, out.last().map(String::as_str))
                .await?;
            if page.is_empty() {
                return Ok(out);
            }
            out.extend(page);
        }
    }

    /// Sizes and modification times of files; `None` for a file that vanished.
    async fn file_infos(&self, paths: &[FsPath]) -> Result<Vec<Option<FileInfo>>> {
        let mut out = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(self.options.scan_count.max(1)) {
            let mut pipe = redis::pipe();
            for p in chunk {
                let f = self.key("f", p.as_str());
                pipe.cmd("EXISTS").arg(&f).cmd("STRLEN").arg(&f);
                pipe.cmd("HGET").arg(self.key("m", p.as_str())).arg("t");
            }
            let values: Vec<redis::Value> = self
                .send("STRLEN", hame_redis::Call::Pipeline(&pipe))
                .await?;
            let mut it = values.into_iter();
            for p in chunk {
                let (Some(e), Some(s), Some(t)) = (it.next(), it.next(), it.next()) else {
                    break;
                };
                let exists: bool = redis::from_redis_value(e).unwrap_or(false);
                let size: u64 = redis::from_redis_value(s).unwrap_or(0);
                let t: Option<String> = redis::from_redis_value(t).unwrap_or(None);
                out.push(exists.then(|| FileInfo {
                    path: p.clone(),
                    kind: FileKind::File,
                    size,
                    modified: parse_ms(t),
                }));
            }
        }
        Ok(out)
    }

    /// Runs `op` on many files, [`BULK_CONCURRENCY`] at a time; `not_found` is skipped.
    async fn bulk(&self, jobs: Vec<(String, Vec<Vec<u8>>)>) -> Result<()> {
        stream::iter(jobs)
            .map(|(op, args)| async move {
                let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let path = FsPath::parse(&text(args.first().map_or(&[][..], Vec::as_slice)))?;
                match self.run(&op, &refs).await? {
                    Reply::Ok(_) => Ok(()),
                    Reply::Err(code, _) if code == "not_found" => Ok(()),
                    Reply::Err(code, arg) => Err(code_error(&code, &arg, &path)),
                }
            })
            .buffer_unordered(BULK_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }
}

fn parse_paths(raw: Vec<String>) -> Vec<FsPath> {
    raw.into_iter()
        .filter_map(|p| match FsPath::parse(&p) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(path = %p, error = %e, "skipping an invalid path in the Redis index");
                None
            }
        })
        .collect()
}

#[async_trait]
impl Filesystem for RedisFs {
    async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
        if path.is_root() {
            return Ok(FileInfo::dir(FsPath::root()));
        }
        let f = self.key("f", path.as_str());
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS")
            .arg(&f)
            .cmd("STRLEN")
            .arg(&f)
            .cmd("HGET")
            .arg(self.key("m", path.as_str()))
            .arg("t")
            .cmd("EXISTS")
            .arg(self.key("d", path.as_str()));
        let (is_file, size, t, is_dir): (bool, u64, Option<String>, bool) =
            self.send("stat", hame_redis::Call::Pipeline(&pipe)).await?;
        if is_file {
            Ok(FileInfo {
                path: path.clone(),
                kind: FileKind::File,
                size,
                modified: parse_ms(t),
            })
        } else if is_dir {
            Ok(FileInfo::dir(path.clone()))
        } else {
            Err(Error::NotFound {
                path: path.to_string(),
            })
        }
    }

    async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
        let dkey = self.key("d", path.as_str());
        let mut names: Vec<String> = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, items): (u64, Vec<Vec<u8>>) = self
                .query(
                    "ZSCAN",
                    redis::cmd("ZSCAN")
                        .arg(&dkey)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(self.options.scan_count.max(1)),
                )
                .await?;
            // Members and scores alternate.
            names.extend(items.iter().step_by(2).map(|m| text(m)));
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        if names.is_empty() {
            if path.is_root() {
                return Ok(Vec::new());
            }
            return Err(if self.stat(path).await.is_ok() {
                Error::NotADirectory {
                    path: path.to_string(),
                }
            } else {
                Error::NotFound {
                    path: path.to_string(),
                }
            });
        }
        names.sort_unstable();
        names.dedup();
        let children: Vec<FsPath> = names.iter().filter_map(|n| path.join(n).ok()).collect();
        let mut out = Vec::with_capacity(children.len());
        for chunk in children.chunks(self.options.scan_count.max(1)) {
            let mut pipe = redis::pipe();
            for c in chunk {
                let f = self.key("f", c.as_str());
                pipe.cmd("EXISTS").arg(&f).cmd("STRLEN").arg(&f);
                pipe.cmd("HGET").arg(self.key("m", c.as_str())).arg("t");
                pipe.cmd("EXISTS").arg(self.key("d", c.as_str()));
            }
            let values: Vec<redis::Value> =
                self.send("list", hame_redis::Call::Pipeline(&pipe)).await?;
            let mut it = values.into_iter();
            for c in chunk {
                let (Some(e), Some(s), Some(t), Some(d)) =
                    (it.next(), it.next(), it.next(), it.next())
                else {
                    break;
                };
                let is_file: bool = redis::from_redis_value(e).unwrap_or(false);
                let is_dir: bool = redis::from_redis_value(d).unwrap_or(false);
                if is_file {
                    let t: Option<String> = redis::from_redis_value(t).unwrap_or(None);
                    out.push(FileInfo {
                        path: c.clone(),
                        kind: FileKind::File,
                        size: redis::from_redis_value(s).unwrap_or(0),
                        modified: parse_ms(t),
                    });
                } else if is_dir {
                    out.push(FileInfo::dir(c.clone()));
                }
            }
        }
        Ok(out)
    }

    async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        self.read_with_generation(path).await.map(|(data, _)| data)
    }

    /// One round trip: `EXISTS` and `GETRANGE` of the content key (and `EXISTS` of the
    /// directory key, to name a directory), so a window of a large file moves only its
    /// bytes.
    async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        let f = self.key("f", path.as_str());
        // GETRANGE takes signed 64-bit inclusive bounds; past the end it returns what
        // there is, and an offset past the end gives nothing.
        let start = i64::try_from(offset).unwrap_or(i64::MAX);
        let end = i64::try_from(offset.saturating_add(len).saturating_sub(1)).unwrap_or(i64::MAX);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS")
            .arg(&f)
            .cmd("EXISTS")
            .arg(self.key("d", path.as_str()));
        if len > 0 {
            pipe.cmd("GETRANGE").arg(&f).arg(start).arg(end);
        } else {
            pipe.cmd("STRLEN").arg(&f);
        }
        let (is_file, is_dir, data): (bool, bool, redis::Value) = self
            .send("read_range", hame_redis::Call::Pipeline(&pipe))
            .await?;
        if !is_file {
            return Err(if is_dir {
                Error::IsDirectory {
                    path: path.to_string(),
                }
            } else {
                Error::NotFound {
                    path: path.to_string(),
                }
            });
        }
        Ok(match data {
            redis::Value::BulkString(bytes) if len > 0 => bytes,
            _ => Vec::new(),
        })
    }

    async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        let version = Version::of(&data);
        let (mode, expected): (&str, &[u8]) = match &options.mode {
            WriteMode::Overwrite => ("o", b""),
            WriteMode::CreateNew => ("c", b""),
            WriteMode::IfMatch(v) => ("v", v.as_str().as_bytes()),
        };
        match self
            .write_script(path, mode, expected, &data, &version)
            .await?
        {
            Reply::Ok(_) => return Ok(version),
            Reply::Err(code, arg) if code != "unknown" => {
                return Err(code_error(&code, &arg, path));
            }
            Reply::Err(..) => {}
        }
        // The file was appended to since its version was stored: compare against the
        // content read together with its generation, then write if the generation holds.
        let WriteMode::IfMatch(expected) = &options.mode else {
            return Err(code_error("unknown", "", path));
        };
        let (current, generation) = match self.read_with_generation(path).await {
            Ok(v) => v,
            Err(Error::NotFound { .. }) => {
                return Err(Error::Conflict {
                    path: path.to_string(),
                    reason: "the file no longer exists".into(),
                });
            }
            Err(e) => return Err(e),
        };
        if Version::of(&current) != *expected {
            return Err(Error::Conflict {
                path: path.to_string(),
                reason: "the content is not the expected version".into(),
            });
        }
        match self
            .write_script(path, "g", &generation, &data, &version)
            .await?
        {
            Reply::Ok(_) => Ok(version),
            Reply::Err(code, arg) => Err(code_error(&code, &arg, path)),
        }
    }

    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
        if path.is_root() {
            return Err(Error::PermissionDenied {
                path: path.to_string(),
                reason: "the root cannot be deleted".into(),
            });
        }
        match self.run("delete", &[path.as_str().as_bytes()]).await? {
            Reply::Ok(_) => return Ok(()),
            Reply::Err(code, _) if code == "not_found" => {}
            Reply::Err(code, arg) => return Err(code_error(&code, &arg, path)),
        }
        if !self.is_dir(path).await? {
            return Err(Error::NotFound {
                path: path.to_string(),
            });
        }
        if !options.recursive {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        loop {
            let page = self.subtree_page(path, None).await?;
            if page.is_empty() {
                return Ok(());
            }
            let jobs = page
                .into_iter()
                .map(|p| ("delete".to_owned(), vec![p.into_bytes()]))
                .collect();
            self.bulk(jobs).await?;
        }
    }

    async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
        if generic::rename_is_noop(self, from, to).await? {
            return Ok(());
        }
        if to.is_root() {
            return Err(Error::IsDirectory {
                path: to.to_string(),
            });
        }
        let overwrite: &[u8] = if options.overwrite { b"1" } else { b"0" };
        match self
            .run(
                "rename",
                &[from.as_str().as_bytes(), to.as_str().as_bytes(), overwrite],
            )
            .await?
        {
            Reply::Ok(_) => return Ok(()),
            Reply::Err(code, _) if code == "not_found" => {}
            Reply::Err(code, arg) => return Err(code_error(&code, &arg, from)),
        }
        // Not a file: a directory?
        if !self.is_dir(from).await? {
            return Err(Error::NotFound {
                path: from.to_string(),
            });
        }
        generic::check_directory_move(self, from, to).await?;
        let files = self.subtree(from).await?;
        let jobs = parse_paths(files)
            .into_iter()
            .filter_map(|p| {
                let rel = p.strip_prefix(from)?;
                let dest = to.join_path(&rel);
                Some((
                    "rename".to_owned(),
                    vec![
                        p.as_str().as_bytes().to_vec(),
                        dest.as_str().as_bytes().to_vec(),
                        b"0".to_vec(),
                    ],
                ))
            })
            .collect();
        self.bulk(jobs).await
    }

    async fn exists(&self, path: &FsPath) -> Result<bool> {
        if path.is_root() {
            return Ok(true);
        }
        let n: u64 = self
            .query(
                "EXISTS",
                redis::cmd("EXISTS")
                    .arg(self.key("f", path.as_str()))
                    .arg(self.key("d", path.as_str())),
            )
            .await?;
        Ok(n > 0)
    }

    /// Both durabilities alike: Redis persists (or not) as its server is configured.
    async fn append(&self, path: &FsPath, data: Vec<u8>, _: AppendOptions) -> Result<()> {
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        match self
            .run(
                "append",
                &[path.as_str().as_bytes(), &data, now_ms().as_bytes()],
            )
            .await?
        {
            Reply::Ok(_) => Ok(()),
            Reply::Err(code, arg) => Err(code_error(&code, &arg, path)),
        }
    }

    async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
        generic::validate_edit(request)?;
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        let attempts = self.options.edit_retries.max(1);
        for attempt in 0..attempts {
            backoff(attempt).await;
            let (data, generation) = self.read_with_generation(path).await?;
            let (new_data, replacements) = generic::edited(path, &data, request)?;
            let version = Version::of(&new_data);
            match self
                .write_script(path, "g", &generation, &new_data, &version)
                .await?
            {
                Reply::Ok(_) => {
                    return Ok(EditOutcome {
                        replacements,
                        version,
                    });
                }
                Reply::Err(code, _) if code == "conflict" => {
                    tracing::debug!(%path, attempt, "edit raced another writer; re-applying");
                }
                Reply::Err(code, arg) => return Err(code_error(&code, &arg, path)),
            }
        }
        Err(Error::Conflict {
            path: path.to_string(),
            reason: format!("{attempts} attempts raced other writers"),
        })
    }

    /// The shared grep engine, fed a page of the subtree index at a time: sizes by one
    /// pipelined `STRLEN` per batch, contents by one `MGET`.
    async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
        let mut search = GrepSearch::new(request)?;
        let base = &request.path;
        let base_info = self.stat(base).await?;
        let mut after: Option<String> = None;
        loop {
            let page: Vec<FsPath> = if base_info.is_dir() {
                let raw = self.subtree_page(base, after.as_deref()).await?;
                let Some(last) = raw.last().cloned() else {
                    break;
                };
                after = Some(last);
                parse_paths(raw)
            } else if after.is_none() {
                after = Some(String::new());
                vec![base.clone()]
            } else {
                break;
            };
            let wanted: Vec<FsPath> = page
                .into_iter()
                .filter(|p| search.matches_glob(p))
                .collect();
            for chunk in wanted.chunks(GREP_BATCH) {
                let mut pipe = redis::pipe();
                for p in chunk {
                    pipe.cmd("STRLEN").arg(self.key("f", p.as_str()));
                }
                let sizes: Vec<u64> = self
                    .send("STRLEN", hame_redis::Call::Pipeline(&pipe))
                    .await?;
                let small: Vec<&FsPath> = chunk
                    .iter()
                    .zip(sizes)
                    .filter(|(p, size)| search.wants(&FileInfo::file((*p).clone(), *size)))
                    .map(|(p, _)| p)
                    .collect();
                if small.is_empty() {
                    continue;
                }
                let keys: Vec<String> = small.iter().map(|p| self.key("f", p.as_str())).collect();
                let contents: Vec<Option<Vec<u8>>> =
                    self.query("MGET", redis::cmd("MGET").arg(&keys)).await?;
                for (p, data) in small.into_iter().zip(contents) {
                    // `None`: deleted since the index was read.
                    let content = data.ok_or_else(|| Error::NotFound {
                        path: p.to_string(),
                    });
                    if !search.feed(p, content)? {
                        return Ok(search.finish());
                    }
                }
            }
        }
        Ok(search.finish())
    }

    async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
        let matcher = generic::compile_glob(&request.pattern)?;
        let base = &request.path;
        let info = self.stat(base).await?;
        if !info.is_dir() {
            return generic::glob_filter(request, [info]);
        }
        let mut hits: Vec<FsPath> = Vec::new();
        let mut after: Option<String> = None;
        'pages: loop {
            let raw = self.subtree_page(base, after.as_deref()).await?;
            let Some(last) = raw.last().cloned() else {
                break;
            };
            after = Some(last);
            for p in parse_paths(raw) {
                let Some(rel) = p.strip_prefix(base) else {
                    continue;
                };
                if matcher.is_match(rel.as_str()) {
                    hits.push(p);
                    if hits.len() > request.max_results {
                        break 'pages;
                    }
                }
            }
        }
        let truncated = hits.len() > request.max_results;
        hits.truncate(request.max_results);
        let files = self
            .file_infos(&hits)
            .await?
            .into_iter()
            .flatten()
            .collect();
        Ok(GlobOutput { files, truncated })
    }

    /// One read-only run of the script: every listing in one round trip, of one moment.
    async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(requests.len() * 3);
        for r in requests {
            args.push(r.path.as_str().as_bytes().to_vec());
            args.push(if r.recursive { b"1" } else { b"0" }.to_vec());
            // A listing of some names is capped once filtered, here.
            args.push(
                if r.max_results >= LIST_CAP_MAX || (!r.recursive && r.names.is_some()) {
                    Vec::new()
                } else {
                    r.max_results.to_string().into_bytes()
                },
            );
        }
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        match self.run_as("list", "", &refs).await? {
            Reply::Ok(values) => parse_listings(values, requests),
            Reply::Err(code, arg) => Err(code_error(&code, &arg, &FsPath::root())),
        }
    }
}

/// The listings of the script's `list` reply, one per request (see `redis.lua`).
fn parse_listings(values: Vec<Vec<u8>>, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
    let short = || Error::Backend {
        message: "a short listing reply from the RedisFs script".into(),
        source: None,
    };
    let mut it = values.into_iter();
    let mut next = || it.next().ok_or_else(short);
    let mut out = Vec::with_capacity(requests.len());
    for r in requests {
        let status = text(&next()?);
        if status != "ok" {
            let arg = text(&next()?);
            out.push(Err(code_error(&status, &arg, &r.path)));
            continue;
        }
        let n: usize = text(&next()?).parse().map_err(|_| short())?;
        let more = next()? == b"1";
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let (path, kind, size, t) = (next()?, next()?, next()?, next()?);
            let path = match FsPath::parse(&text(&path)) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(path = %text(&path), error = %e, "skipping an invalid path in the Redis index");
                    continue;
                }
            };
            entries.push(if kind == b"d" {
                FileInfo::dir(path)
            } else {
                FileInfo {
                    path,
                    kind: FileKind::File,
                    size: text(&size).parse().unwrap_or(0),
                    modified: parse_ms(Some(text(&t))),
                }
            });
        }
        let mut listing = r.answer(entries);
        listing.truncated |= more;
        out.push(Ok(listing));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn fs() -> Result<Option<RedisFs>> {
        let Some(url) = hame_test_env::service("HAME_TEST_REDIS_URL", "RedisFs write-id") else {
            return Ok(None);
        };
        let ns = format!("retry-{}", uuid::Uuid::new_v4().simple());
        Ok(Some(
            RedisFs::connect(&url, &ns, RedisOptions::default()).await?,
        ))
    }

    fn ok(reply: Reply) -> bool {
        matches!(reply, Reply::Ok(_))
    }

    /// A mutation sent again under its write id — its first reply lost with a broken
    /// connection after the server applied it — is answered as the first run was and
    /// applied once; the same change under a new id is a new change.
    #[tokio::test]
    async fn a_mutation_sent_again_under_its_write_id_is_applied_once() -> Result<()> {
        let Some(fs) = fs().await? else {
            return Ok(());
        };
        let log = FsPath::parse("sessions/s.log.jsonl")?;
        let append = [log.as_str().as_bytes(), b"line\n", b"0"];
        assert!(ok(fs.run_as("append", "a1", &append).await?));
        assert!(ok(fs.run_as("append", "a1", &append).await?));
        assert_eq!(fs.read_bytes(&log).await?, b"line\n");
        assert!(ok(fs.run_as("append", "a2", &append).await?));
        assert_eq!(fs.read_bytes(&log).await?, b"line\nline\n");

        // A create-only write reports success again, not `already_exists`.
        let new = FsPath::parse("new.md")?;
        let version = Version::of(b"x");
        let create = [
            new.as_str().as_bytes(),
            b"c",
            b"",
            b"x",
            version.as_str().as_bytes(),
            b"0",
        ];
        assert!(ok(fs.run_as("write", "w1", &create).await?));
        assert!(ok(fs.run_as("write", "w1", &create).await?));
        assert!(matches!(
            fs.run_as("write", "w2", &create).await?,
            Reply::Err(code, _) if code == "already_exists"
        ));

        // A rename and a delete report success again, not `not_found`.
        let moved = FsPath::parse("moved.md")?;
        let rename = [new.as_str().as_bytes(), moved.as_str().as_bytes(), b"0"];
        assert!(ok(fs.run_as("rename", "r1", &rename).await?));
        assert!(ok(fs.run_as("rename", "r1", &rename).await?));
        assert_eq!(fs.read_bytes(&moved).await?, b"x");
        let delete = [moved.as_str().as_bytes()];
        assert!(ok(fs.run_as("delete", "d1", &delete).await?));
        assert!(ok(fs.run_as("delete", "d1", &delete).await?));
        assert!(!fs.exists(&moved).await?);
        Ok(())
    }
}
