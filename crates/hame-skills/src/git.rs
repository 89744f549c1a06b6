//! Skills in a Git repository (feature `git`), fetched with `gix`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::repository::{SkillRepository, Snapshot};
use crate::{Error, Result};

/// Most files taken from one commit.
pub const MAX_FILES: usize = 10_000;
/// Most bytes taken from one commit (all files).
pub const MAX_BYTES: u64 = 64 * 1024 * 1024;

/// A Git repository of skills: `url` (`https://`, `ssh://`, `git://`, `file://` or a
/// path), `reference` (a branch, a tag or a commit id; default the remote's `HEAD`), and
/// `subdir` (where the `<name>/SKILL.md` folders are; default the root).
///
/// Each fetch clones the repository (bare, into a temporary directory of the cache) and
/// writes the tree of the resolved commit to `<cache>/<key>/<commit>/` unless that
/// directory exists already (a commit's files never change); the snapshot is that
/// directory and the commit id is its version. Older commits' directories are removed
/// after a new one is written.
#[derive(Debug)]
pub struct GitRepository {
    url: String,
    reference: Option<String>,
    subdir: Option<String>,
    cache: PathBuf,
}

fn short_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `url` without a password.
fn shown(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((authority, path)) => match authority.rsplit_once('@') {
                Some((creds, host)) => {
                    let user = creds.split(':').next().unwrap_or("");
                    format!("{scheme}://{user}@{host}/{path}")
                }
                None => url.to_owned(),
            },
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl GitRepository {
    /// A repository; its clones and checkouts go under `cache_dir/<sha256(url, ref,
    /// subdir)[..16]>/`. Nothing is fetched yet.
    pub fn new(
        url: &str,
        reference: Option<&str>,
        subdir: Option<&str>,
        cache_dir: &Path,
    ) -> Result<Self> {
        if url.trim().is_empty() {
            return Err(Error::Config("a Git skills repository needs a URL".into()));
        }
        if let Some(r) = reference
            && (r.is_empty() || r.starts_with('-') || r.contains(['\0', ' ', '~', '^', ':']))
        {
            return Err(Error::Config(format!(
                "skills repository {}: `{r}` is not a branch, tag or commit name",
                shown(url)
            )));
        }
        if let Some(s) = subdir {
            hame_fs::FsPath::parse(s).map_err(|e| {
                Error::Config(format!("skills repository {}: path `{s}`: {e}", shown(url)))
            })?;
        }
        let key = short_hash(&format!(
            "{url}\0{}\0{}",
            reference.unwrap_or(""),
            subdir.unwrap_or("")
        ));
        Ok(Self {
            url: url.to_owned(),
            reference: reference.map(str::to_owned),
            subdir: subdir
                .map(|s| s.trim_matches('/').to_owned())
                .filter(|s| !s.is_empty()),
            cache: cache_dir.join(key),
        })
    }

    /// Clones, resolves the reference and writes the commit's tree (blocking).
    fn fetch_blocking(&self) -> std::result::Result<(PathBuf, String), String> {
        std::fs::create_dir_all(&self.cache)
            .map_err(|e| format!("cannot create {}: {e}", self.cache.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix(".clone-")
            .tempdir_in(&self.cache)
            .map_err(|e| format!("cannot create a directory in {}: {e}", self.cache.display()))?;
        let interrupt = AtomicBool::new(false);
        let mut prepare = gix::prepare_clone_bare(self.url.as_str(), tmp.path())
            .map_err(|e| format!("cannot clone: {e}"))?;
        let (repo, _) = prepare
            .fetch_only(gix::progress::Discard, &interrupt)
            .map_err(|e| format!("fetch failed: {e}"))?;
        let commit = resolve(&repo, self.reference.as_deref())?;
        let id = commit.id.to_string();
        let dest = self.cache.join(&id);
        if !dest.is_dir() {
            let staging = self
                .cache
                .join(format!(".checkout-{id}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            let tree = commit.tree().map_err(|e| format!("commit {id}: {e}"))?;
            let mut written = Written::default();
            write_tree(&repo, &tree, &staging, &mut written)?;
            std::fs::rename(&staging, &dest)
                .or_else(|e| if dest.is_dir() { Ok(()) } else { Err(e) })
                .map_err(|e| format!("cannot move the checkout to {}: {e}", dest.display()))?;
            prune(&self.cache, &id);
        }
        let root = match &self.subdir {
            Some(s) => dest.join(s),
            None => dest,
        };
        Ok((root, id))
    }
}

/// The commit `reference` names (a branch, a tag, a commit id), else the remote's
/// `HEAD`.
fn resolve<'r>(
    repo: &'r gix::Repository,
    reference: Option<&str>,
) -> std::result::Result<gix::Commit<'r>, String> {
    let candidates: Vec<String> = match reference {
        Some(r) => vec![
            format!("refs/heads/{r}"),
            format!("refs/remotes/origin/{r}"),
            format!("refs/tags/{r}"),
            r.to_owned(),
        ],
        None => vec!["HEAD".to_owned(), "refs/remotes/origin/HEAD".to_owned()],
    };
    for c in &candidates {
        if let Ok(id) = repo.rev_parse_single(c.as_str())
            && let Ok(obj) = id.object()
            && let Ok(commit) = obj.peel_to_commit()
        {
            return Ok(commit);
        }
    }
    Err(format!(
        "no branch, tag or commit `{}` in the repository",
        reference.unwrap_or("HEAD")
    ))
}

#[derive(Default)]
struct Written {
    files: usize,
    bytes: u64,
}

/// Writes `tree` below `dir`: blobs as files, subtrees as directories; links and
/// submodules are skipped.
fn write_tree(
    repo: &gix::Repository,
    tree: &gix::Tree<'_>,
    dir: &Path,
    written: &mut Written,
) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for entry in tree.iter() {
        let entry = entry.map_err(|e| format!("reading a tree: {e}"))?;
        let name = entry.filename().to_string();
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            continue;
        }
        let path = dir.join(&name);
        let mode = entry.mode();
        if mode.is_tree() {
            let sub = repo
                .find_object(entry.oid())
                .map_err(|e| format!("{name}: {e}"))?
                .try_into_tree()
                .map_err(|e| format!("{name}: {e}"))?;
            write_tree(repo, &sub, &path, written)?;
        } else if mode.is_blob() {
            written.files += 1;
            if written.files > MAX_FILES {
                return Err(format!("more than {MAX_FILES} files in the commit"));
            }
            let blob = repo
                .find_object(entry.oid())
                .map_err(|e| format!("{name}: {e}"))?;
            written.bytes += blob.data.len() as u64;
            if written.bytes > MAX_BYTES {
                return Err(format!("more than {MAX_BYTES} bytes in the commit"));
            }
            std::fs::write(&path, &blob.data)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Removes the checkouts of other commits (a run that still reads one keeps its open
/// files; the next catalog uses the new one).
fn prune(cache: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != keep && name.len() == 40 && name.chars().all(|c| c.is_ascii_hexdigit()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[async_trait]
impl SkillRepository for GitRepository {
    fn label(&self) -> String {
        let mut s = format!("git {}", shown(&self.url));
        if let Some(r) = &self.reference {
            s.push('@');
            s.push_str(r);
        }
        if let Some(p) = &self.subdir {
            s.push(':');
            s.push_str(p);
        }
        s
    }

    async fn fetch(&self) -> Result<Snapshot> {
        let this = GitRepository {
            url: self.url.clone(),
            reference: self.reference.clone(),
            subdir: self.subdir.clone(),
            cache: self.cache.clone(),
        };
        let label = self.label();
        let (root, id) = tokio::task::spawn_blocking(move || this.fetch_blocking())
            .await
            .map_err(|e| Error::storage(&format!("skills repository {label}"), e))?
            .map_err(|e| {
                Error::storage(
                    &format!("skills repository {label}"),
                    hame_core::secrets::redact(&e).into_owned(),
                )
            })?;
        if !root.is_dir() {
            return Err(Error::Invalid(format!(
                "skills repository {label}: commit {id} has no directory `{}`",
                self.subdir.as_deref().unwrap_or("")
            )));
        }
        let fs = hame_fs::LocalFs::new(&root).map_err(|e| {
            Error::storage(
                &format!("skills repository {label}: opening the checkout"),
                e,
            )
        })?;
        Ok(Snapshot {
            files: Arc::new(fs),
            version: id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_never_show_a_password() {
        assert_eq!(
            shown("https://bot:tok@git.example.com/o/r.git"),
            "https://bot@git.example.com/o/r.git"
        );
        assert_eq!(shown("file:///srv/r.git"), "file:///srv/r.git");
    }

    #[test]
    fn bad_settings_are_refused() {
        let c = Path::new("/tmp");
        assert!(GitRepository::new("", None, None, c).is_err());
        assert!(GitRepository::new("file:///r", Some("--upload-pack=x"), None, c).is_err());
        assert!(GitRepository::new("file:///r", Some("a b"), None, c).is_err());
        assert!(GitRepository::new("file:///r", None, Some("../up"), c).is_err());
        assert!(GitRepository::new("file:///r", Some("main"), Some("skills"), c).is_ok());
    }
}
