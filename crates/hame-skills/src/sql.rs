//! Skills in a PostgreSQL or MySQL/MariaDB table (feature `sql`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hame_fs::{Filesystem, FsPath, InMemoryFs, WriteOptions};
use sha2::{Digest, Sha256};

use crate::repository::{SkillRepository, Snapshot};
use crate::{Error, Result};

/// Default table of a SQL repository.
pub const DEFAULT_TABLE: &str = "hame_skills";
/// Most rows read from a table.
pub const MAX_ROWS: usize = 10_000;
/// Most bytes read from a table (all rows).
pub const MAX_TABLE_BYTES: usize = 64 * 1024 * 1024;

/// A table of skills: one row per file, `(skill, path, content)`, where `path` is
/// `SKILL.md` for the skill itself and a relative path for a resource:
///
/// ```sql
/// CREATE TABLE hame_skills (
///   skill   VARCHAR(64)  NOT NULL,
///   path    VARCHAR(255) NOT NULL,
///   content TEXT         NOT NULL,
///   PRIMARY KEY (skill, path)
/// );
/// ```
///
/// hame only reads it (`SELECT skill, path, content FROM <table>`); the version is the
/// first 12 hex digits of SHA-256 over the rows in order, so any change of a row is a new
/// version. It reads through the state store's pool when the state store is on the same
/// database URL (`hame_sql::shared`: no connection of its own), else through a pool of its
/// own: one connection, opened at the first fetch.
#[derive(Debug)]
pub struct SqlRepository {
    label: String,
    table: String,
    url: Secret,
    pool: Pool,
}

/// The database URL: only the shared pool is looked up by it; never shown.
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&shown(&self.0))
    }
}

#[derive(Debug)]
enum Pool {
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

/// `url` without its password, for labels and errors.
fn shown(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((creds, host)) => {
                let user = creds.split(':').next().unwrap_or("");
                format!("{scheme}://{user}@{host}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

fn valid_table(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !t.starts_with(|c: char| c.is_ascii_digit())
}

impl SqlRepository {
    /// A repository on table `table` (default [`DEFAULT_TABLE`]; `[A-Za-z_][A-Za-z0-9_]*`)
    /// of the database at `url` (`postgres://…`, `mysql://…`, `mariadb://…`). Nothing is
    /// connected yet.
    pub fn new(url: &str, table: Option<&str>) -> Result<Self> {
        let table = table.unwrap_or(DEFAULT_TABLE).to_owned();
        if !valid_table(&table) {
            return Err(Error::Config(format!(
                "skills repository table `{table}` is not a plain table name (letters, digits, `_`)"
            )));
        }
        fn options<DB: sqlx::Database>() -> sqlx::pool::PoolOptions<DB> {
            sqlx::pool::PoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(10))
        }
        let bad = |e: sqlx::Error| {
            Error::Config(format!(
                "skills repository {}: {e} (check the URL)",
                shown(url)
            ))
        };
        let pool = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Pool::Postgres(options::<sqlx::Postgres>().connect_lazy(url).map_err(bad)?)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let url = url.replacen("mariadb://", "mysql://", 1);
            Pool::MySql(options::<sqlx::MySql>().connect_lazy(&url).map_err(bad)?)
        } else {
            return Err(Error::Config(format!(
                "skills repository {}: a SQL repository needs a postgres:// or mysql:// URL",
                shown(url)
            )));
        };
        Ok(Self {
            label: format!("sql {} table {table}", shown(url)),
            table,
            url: Secret(url.to_owned()),
            pool,
        })
    }

    async fn rows(&self) -> std::result::Result<Vec<(String, String, String)>, sqlx::Error> {
        // The table name is checked by `valid_table` (letters, digits, `_`).
        let sql = || {
            sqlx::AssertSqlSafe(format!(
                "SELECT skill, path, content FROM {} ORDER BY skill, path",
                self.table
            ))
        };
        if let Some(shared) = hame_sql::shared(&self.url.0) {
            return sqlx::query_as(sql()).fetch_all(&shared).await;
        }
        match &self.pool {
            Pool::Postgres(p) => sqlx::query_as(sql()).fetch_all(p).await,
            Pool::MySql(p) => sqlx::query_as(sql()).fetch_all(p).await,
        }
    }
}

#[async_trait]
impl SkillRepository for SqlRepository {
    fn label(&self) -> String {
        self.label.clone()
    }

    async fn fetch(&self) -> Result<Snapshot> {
        let rows = self.rows().await.map_err(|e| {
            Error::storage(
                &format!("skills repository {}: reading failed", self.label),
                e.to_string(),
            )
        })?;
        if rows.len() > MAX_ROWS {
            return Err(Error::Invalid(format!(
                "skills repository {}: {} rows, over the limit of {MAX_ROWS}",
                self.label,
                rows.len()
            )));
        }
        let fs = InMemoryFs::new();
        let mut digest = Sha256::new();
        let mut total = 0usize;
        for (skill, path, content) in rows {
            total += content.len();
            if total > MAX_TABLE_BYTES {
                return Err(Error::Invalid(format!(
                    "skills repository {}: over {MAX_TABLE_BYTES} bytes of content",
                    self.label
                )));
            }
            for part in [&skill, &path, &content] {
                digest.update((part.len() as u64).to_le_bytes());
                digest.update(part.as_bytes());
            }
            // A hostile row cannot leave its skill's folder: both parts are validated
            // paths, and the skill name is one segment.
            let Ok(p) = FsPath::parse(&format!("{skill}/{path}")) else {
                tracing::warn!(repository = %self.label, %skill, %path, "row skipped: not a relative path");
                continue;
            };
            if !crate::valid_name(&skill)
                || p.as_str().trim_start_matches('/').split('/').next() != Some(skill.as_str())
            {
                tracing::warn!(repository = %self.label, %skill, %path, "row skipped: not a valid skill name or path");
                continue;
            }
            fs.write(&p, content.into_bytes(), WriteOptions::default())
                .await
                .map_err(|e| Error::storage("copying a skill", e))?;
        }
        let version: String = digest
            .finalize()
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Snapshot {
            files: Arc::new(fs),
            version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_never_show_a_password() {
        assert_eq!(
            shown("postgres://hame:s3cret@db:5432/x"),
            "postgres://hame@db:5432/x"
        );
        assert_eq!(shown("mysql://db/x"), "mysql://db/x");
    }

    #[test]
    fn table_names_are_plain() {
        assert!(valid_table("hame_skills"));
        for bad in ["", "a;drop", "a b", "1x", "s.t", "a\"b"] {
            assert!(!valid_table(bad), "{bad}");
        }
    }
}
