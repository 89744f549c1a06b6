//! Skill repositories (issue 35, item 3): the layering with the workspace, the refresh
//! interval, and the real backends — a bare Git repository over `file://` and over `git
//! daemon` on 127.0.0.1 (feature `git`), PostgreSQL and MariaDB tables (feature `sql`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use hame_fs::{Filesystem, FsPath, InMemoryFs, LocalFs, WriteOptions};
use hame_skills::{SkillRepository, Skills, SkillsOptions, Snapshot};
use hame_tools::{Identity, Workspace, WorkspaceMode};
use pretty_assertions::assert_eq;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn skill_md(description: &str, body: &str) -> String {
    format!("---\ndescription: {description}\n---\n{body}\n")
}

async fn put(fs: &dyn Filesystem, path: &str, text: &str) -> TestResult {
    fs.write(
        &FsPath::parse(path)?,
        text.as_bytes().to_vec(),
        WriteOptions::default(),
    )
    .await?;
    Ok(())
}

/// A repository whose content and version the test sets; it counts its fetches and can
/// be made to fail.
#[derive(Debug)]
struct Scripted {
    name: String,
    files: std::sync::Mutex<(Arc<InMemoryFs>, String)>,
    fetches: AtomicUsize,
    fail: std::sync::atomic::AtomicBool,
}

impl Scripted {
    fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            files: std::sync::Mutex::new((Arc::new(InMemoryFs::new()), "v0".into())),
            fetches: AtomicUsize::new(0),
            fail: Default::default(),
        })
    }

    async fn set(&self, version: &str, skills: &[(&str, &str, &str)]) -> TestResult {
        let fs = Arc::new(InMemoryFs::new());
        for (name, description, body) in skills {
            put(
                fs.as_ref(),
                &format!("{name}/SKILL.md"),
                &skill_md(description, body),
            )
            .await?;
        }
        *self.files.lock().map_err(|_| "poisoned")? = (fs, version.into());
        Ok(())
    }
}

#[async_trait]
impl SkillRepository for Scripted {
    fn label(&self) -> String {
        format!("test {}", self.name)
    }

    async fn fetch(&self) -> hame_skills::Result<Snapshot> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(hame_skills::Error::NotFound("unreachable (test)".into()));
        }
        let (fs, version) = self
            .files
            .lock()
            .map(|g| g.clone())
            .map_err(|_| hame_skills::Error::NotFound("poisoned".into()))?;
        Ok(Snapshot { files: fs, version })
    }
}

fn workspace(
    root: &std::path::Path,
    user: Option<&str>,
) -> Result<Workspace, Box<dyn std::error::Error>> {
    let fs: Arc<dyn Filesystem> = Arc::new(LocalFs::new(root)?);
    let ws = Workspace::new(
        Identity::new("hame", user, "s1"),
        WorkspaceMode::TrustedLocal,
        fs.clone(),
        fs,
    );
    Ok(match user {
        Some(u) => {
            std::fs::create_dir_all(root.join(u))?;
            ws.with_overrides(Arc::new(LocalFs::new(root.join(u))?))
        }
        None => ws,
    })
}

#[tokio::test]
async fn layers_resolve_user_over_workspace_over_repositories_in_declared_order() -> TestResult {
    let dir = tempfile::tempdir()?;
    let first = Scripted::new("first");
    let second = Scripted::new("second");
    first
        .set(
            "f1",
            &[
                ("deploy", "Deploy (first).", "FIRST"),
                ("lint", "Lint.", "LINT"),
            ],
        )
        .await?;
    second
        .set(
            "s1",
            &[
                ("deploy", "Deploy (second).", "SECOND"),
                ("audit", "Audit.", "AUDIT"),
                ("review", "Review (repo).", "REPO"),
            ],
        )
        .await?;
    let root = dir.path();
    std::fs::create_dir_all(root.join("skills/review"))?;
    std::fs::write(
        root.join("skills/review/SKILL.md"),
        skill_md("Review (workspace).", "WS"),
    )?;
    std::fs::create_dir_all(root.join("alice/skills/lint"))?;
    std::fs::write(
        root.join("alice/skills/lint/SKILL.md"),
        skill_md("Lint (alice).", "ALICE"),
    )?;
    let skills = Skills::new(
        SkillsOptions::default()
            .with_repository(first.clone())
            .with_repository(second.clone()),
    )?;
    let ws = workspace(root, Some("alice"))?;
    let catalog = skills.catalog(&ws, None).await;
    let rows: Vec<(&str, &str, &str, Option<&str>)> = catalog
        .skills
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.layer.as_str(),
                s.source.as_str(),
                s.version.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("audit", "repository", "test second", Some("s1")),
            ("deploy", "repository", "test first", Some("f1")),
            ("lint", "user", "user", None),
            ("review", "workspace", "workspace", None),
        ]
    );
    let shadowed: Vec<(&str, &str, Vec<String>)> = catalog
        .shadowed
        .iter()
        .map(|s| (s.name.as_str(), s.used.as_str(), s.hidden.clone()))
        .collect();
    assert_eq!(
        shadowed,
        vec![
            ("deploy", "test first", vec!["test second".to_owned()]),
            ("lint", "user", vec!["test first".to_owned()]),
            ("review", "workspace", vec!["test second".to_owned()]),
        ]
    );
    // load_skill pins the repository's version in its result (the session log).
    let loaded = skills.load(&ws, "deploy", None).await?;
    assert!(
        loaded.starts_with(
            "<skill name=\"deploy\" layer=\"repository\" source=\"test first\" version=\"f1\""
        ),
        "{loaded}"
    );
    assert!(loaded.contains("FIRST"), "{loaded}");
    assert!(skills.load(&ws, "lint", None).await?.contains("ALICE"));
    Ok(())
}

#[tokio::test]
async fn a_repository_is_fetched_again_only_after_the_interval_and_a_failure_keeps_the_last()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let repo = Scripted::new("r");
    repo.set("v1", &[("a", "A.", "one")]).await?;
    let skills = Skills::new(
        SkillsOptions::default()
            .with_repository(repo.clone())
            .with_refresh(Duration::from_millis(300)),
    )?;
    let ws = workspace(dir.path(), None)?;
    for _ in 0..5 {
        let c = skills.catalog(&ws, None).await;
        assert_eq!(c.skills[0].version.as_deref(), Some("v1"));
    }
    assert_eq!(
        repo.fetches.load(Ordering::SeqCst),
        1,
        "one fetch per interval"
    );
    repo.set("v2", &[("a", "A.", "two"), ("b", "B.", "new")])
        .await?;
    assert_eq!(
        skills.catalog(&ws, None).await.skills.len(),
        1,
        "not before the interval"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    let c = skills.catalog(&ws, None).await;
    assert_eq!(c.skills.len(), 2);
    assert_eq!(c.skills[0].version.as_deref(), Some("v2"));
    // A failed refresh: the last snapshot stays, the error is reported.
    repo.fail.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let c = skills.catalog(&ws, None).await;
    assert_eq!(c.skills.len(), 2);
    assert_eq!(c.repository_errors.len(), 1);
    assert!(
        c.repository_errors[0].error.contains("unreachable"),
        "{:?}",
        c.repository_errors
    );
    // …and is not retried at every step.
    let n = repo.fetches.load(Ordering::SeqCst);
    skills.catalog(&ws, None).await;
    assert_eq!(repo.fetches.load(Ordering::SeqCst), n);
    Ok(())
}

#[cfg(feature = "git")]
mod git {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
        Ok(hame_test_env::git(dir, args)?)
    }

    /// A bare repository `origin.git` and a clone `work` to push from; `None` (skipped
    /// loudly) without a `git` program.
    pub(crate) fn bare(
        root: &Path,
    ) -> Result<Option<(std::path::PathBuf, std::path::PathBuf)>, Box<dyn std::error::Error>> {
        if Command::new("git").arg("--version").output().is_err() {
            hame_test_env::skip("no git program");
            return Ok(None);
        }
        let origin = root.join("origin.git");
        let work = root.join("work");
        git(
            root,
            &[
                "init",
                "-q",
                "--bare",
                "-b",
                "main",
                &origin.to_string_lossy(),
            ],
        )?;
        git(root, &["init", "-q", "-b", "main", &work.to_string_lossy()])?;
        git(
            &work,
            &["remote", "add", "origin", &origin.to_string_lossy()],
        )?;
        Ok(Some((origin, work)))
    }

    pub(crate) fn push_skill(
        work: &Path,
        name: &str,
        body: &str,
    ) -> Result<String, Box<dyn std::error::Error>> {
        let dir = work.join("skills").join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("SKILL.md"),
            skill_md(&format!("The {name} skill."), body),
        )?;
        std::fs::create_dir_all(dir.join("scripts"))?;
        std::fs::write(dir.join("scripts/run.sh"), "echo hi\n")?;
        git(work, &["add", "-A"])?;
        git(work, &["commit", "-q", "-m", name])?;
        git(work, &["push", "-q", "origin", "main"])?;
        git(work, &["rev-parse", "HEAD"])
    }

    async fn check(url: &str, work: &Path, cache: &Path) -> TestResult {
        let first = push_skill(work, "deploy", "v1 body")?;
        let repo = hame_skills::GitRepository::new(url, Some("main"), Some("skills"), cache)?;
        assert!(repo.label().starts_with("git "), "{}", repo.label());
        let snap = repo.fetch().await?;
        assert_eq!(snap.version, first);
        let text = snap
            .files
            .read_bytes(&FsPath::parse("deploy/SKILL.md")?)
            .await?;
        assert!(String::from_utf8(text)?.contains("v1 body"));
        assert!(
            snap.files
                .exists(&FsPath::parse("deploy/scripts/run.sh")?)
                .await?
        );
        // A new commit: the next fetch sees it, under its own id.
        let second = push_skill(work, "audit", "audit body")?;
        let snap = repo.fetch().await?;
        assert_eq!(snap.version, second);
        assert!(snap.files.exists(&FsPath::parse("audit/SKILL.md")?).await?);
        // A missing branch is a clear error.
        let bad = hame_skills::GitRepository::new(url, Some("nope"), None, cache)?;
        let e = bad.fetch().await.err().ok_or("fetched a missing branch")?;
        assert!(
            e.to_string().contains("no branch, tag or commit `nope`"),
            "{e}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_bare_repository_over_file_url() -> TestResult {
        let dir = tempfile::tempdir()?;
        let Some((origin, work)) = bare(dir.path())? else {
            return Ok(());
        };
        check(
            &format!("file://{}", origin.display()),
            &work,
            &dir.path().join("cache"),
        )
        .await
    }

    /// `git daemon` on 127.0.0.1, killed on drop.
    struct Daemon(std::process::Child);
    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[tokio::test]
    async fn a_bare_repository_over_git_daemon() -> TestResult {
        let dir = tempfile::tempdir()?;
        let Some((_, work)) = bare(dir.path())? else {
            return Ok(());
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // The dashed program itself: `git daemon` would run it as a child that killing
        // `git` leaves behind.
        let exec_path = git(dir.path(), &["--exec-path"])?;
        let child = Command::new(Path::new(&exec_path).join("git-daemon"))
            .args([
                "--reuseaddr",
                "--export-all",
                "--listen=127.0.0.1",
                &format!("--port={port}"),
                &format!("--base-path={}", dir.path().display()),
                &dir.path().to_string_lossy(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let Ok(child) = child else {
            hame_test_env::skip("git daemon does not start");
            return Ok(());
        };
        let _daemon = Daemon(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if std::time::Instant::now() > deadline {
                return Err("git daemon did not listen".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        check(
            &format!("git://127.0.0.1:{port}/origin.git"),
            &work,
            &dir.path().join("cache"),
        )
        .await
    }
}

#[cfg(feature = "sql")]
mod sql {
    use super::*;
    use pretty_assertions::{assert_eq, assert_ne};

    async fn check(url: &str, table: &str) -> TestResult {
        let repo = hame_skills::SqlRepository::new(url, Some(table))?;
        assert!(
            !repo.label().contains(":postgres@") && !repo.label().contains(":test@"),
            "{}",
            repo.label()
        );
        let (create, insert, update, drop_) = (
            format!(
                "CREATE TABLE {table} (skill VARCHAR(64) NOT NULL, path VARCHAR(255) NOT NULL, content TEXT NOT NULL, PRIMARY KEY (skill, path))"
            ),
            format!(
                "INSERT INTO {table} (skill, path, content) VALUES ('deploy', 'SKILL.md', '{}'), ('deploy', 'notes.md', 'n'), ('evil', '../../etc/passwd', 'x')",
                skill_md("Deploy.", "sql body")
            ),
            format!("UPDATE {table} SET content = 'changed' WHERE path = 'notes.md'"),
            format!("DROP TABLE IF EXISTS {table}"),
        );
        exec(url, &drop_).await?;
        exec(url, &create).await?;
        exec(url, &insert).await?;
        let snap = repo.fetch().await?;
        let text = snap
            .files
            .read_bytes(&FsPath::parse("deploy/SKILL.md")?)
            .await?;
        assert!(String::from_utf8(text)?.contains("sql body"));
        assert!(
            snap.files
                .exists(&FsPath::parse("deploy/notes.md")?)
                .await?
        );
        // A hostile path never leaves its skill's folder.
        assert!(
            !snap
                .files
                .exists(&FsPath::parse("etc/passwd")?)
                .await
                .unwrap_or(false)
        );
        let v1 = snap.version;
        assert_eq!(repo.fetch().await?.version, v1, "same rows, same version");
        exec(url, &update).await?;
        assert_ne!(
            repo.fetch().await?.version,
            v1,
            "a changed row is a new version"
        );
        exec(url, &drop_).await?;
        let e = repo.fetch().await.err().ok_or("a dropped table fetched")?;
        assert!(e.to_string().contains("reading failed"), "{e}");
        Ok(())
    }

    /// On the state store's database the repository reads through the state store's pool
    /// (shared by URL), not a pool of its own.
    async fn through_the_shared_pool(url: &str, table: &str) -> TestResult {
        sqlx::any::install_default_drivers();
        let state_pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect_lazy(url)?;
        hame_sql::share(url, &state_pool);
        let repo = hame_skills::SqlRepository::new(url, Some(table))?;
        let drop_ = format!("DROP TABLE IF EXISTS {table}");
        exec(url, &drop_).await?;
        exec(url, &format!("CREATE TABLE {table} (skill VARCHAR(64) NOT NULL, path VARCHAR(255) NOT NULL, content TEXT NOT NULL, PRIMARY KEY (skill, path))")).await?;
        exec(
            url,
            &format!(
                "INSERT INTO {table} (skill, path, content) VALUES ('deploy', 'SKILL.md', '{}')",
                skill_md("Deploy.", "shared body")
            ),
        )
        .await?;
        assert_eq!(state_pool.size(), 0, "nothing connected yet");
        let snap = repo.fetch().await?;
        let text = snap
            .files
            .read_bytes(&FsPath::parse("deploy/SKILL.md")?)
            .await?;
        assert!(String::from_utf8(text)?.contains("shared body"));
        assert_eq!(state_pool.size(), 1, "the fetch used the shared pool");
        state_pool.close().await;
        // Closed: the repository falls back to a pool of its own.
        assert!(repo.fetch().await.is_ok());
        exec(url, &drop_).await?;
        Ok(())
    }

    #[tokio::test]
    async fn postgres_repository_uses_the_shared_pool() -> TestResult {
        let Some(url) = hame_test_env::service("HAME_TEST_POSTGRES_URL", "PostgreSQL") else {
            return Ok(());
        };
        through_the_shared_pool(&url, "hame_skills_shared_pg").await
    }

    #[tokio::test]
    async fn mysql_repository_uses_the_shared_pool() -> TestResult {
        let Some(url) = hame_test_env::service("HAME_TEST_MYSQL_URL", "MySQL") else {
            return Ok(());
        };
        through_the_shared_pool(&url, "hame_skills_shared_my").await
    }

    async fn exec(url: &str, sql: &str) -> TestResult {
        use sqlx::Connection;
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        if url.starts_with("postgres") {
            let mut c = sqlx::PgConnection::connect(url).await?;
            sqlx::query(sql).execute(&mut c).await?;
        } else {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            sqlx::query(sql).execute(&mut c).await?;
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_postgres_table() -> TestResult {
        let Some(url) = hame_test_env::service("HAME_TEST_POSTGRES_URL", "PostgreSQL") else {
            return Ok(());
        };
        check(&url, &format!("hame_skills_t{}", std::process::id())).await
    }

    #[tokio::test]
    async fn a_mariadb_table() -> TestResult {
        let Some(url) = hame_test_env::service("HAME_TEST_MYSQL_URL", "MySQL/MariaDB") else {
            return Ok(());
        };
        check(&url, &format!("hame_skills_t{}", std::process::id())).await
    }
}
