//! [`InMemoryFs`]: files in a map, for tests and ephemeral agents.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, FileInfo, FileKind, Filesystem,
    GlobOutput, GlobRequest, GrepOutput, GrepRequest, ListRequest, Listing, RenameOptions, Version,
    WriteMode, WriteOptions,
};
use crate::generic;
use crate::path::FsPath;

#[derive(Debug, Clone)]
struct Entry {
    data: Vec<u8>,
    modified: DateTime<Utc>,
}

/// A filesystem held in memory. Directories are implicit (a directory exists while a file
/// lies below it). Every operation takes one mutex, so compare-and-set, `append` and `edit`
/// are atomic. Cloning is not provided: share it as `Arc<InMemoryFs>`.
#[derive(Debug, Default)]
pub struct InMemoryFs {
    files: Mutex<BTreeMap<FsPath, Entry>>,
}

type Map = BTreeMap<FsPath, Entry>;

fn is_dir(map: &Map, path: &FsPath) -> bool {
    path.is_root()
        || map
            .range(path.clone()..)
            .take_while(|(k, _)| k.as_str().starts_with(path.as_str()))
            .any(|(k, _)| k.starts_with(path) && k != path)
}

fn info(path: &FsPath, e: &Entry) -> FileInfo {
    FileInfo {
        path: path.clone(),
        kind: FileKind::File,
        size: e.data.len() as u64,
        modified: Some(e.modified),
    }
}

/// Fails when a proper ancestor of `path` is a file.
fn check_parents(map: &Map, path: &FsPath) -> Result<()> {
    let mut p = path.parent();
    while let Some(dir) = p {
        if map.contains_key(&dir) {
            return Err(Error::NotADirectory {
                path: dir.to_string(),
            });
        }
        p = dir.parent();
    }
    Ok(())
}

fn write_locked(map: &mut Map, path: &FsPath, data: Vec<u8>, mode: &WriteMode) -> Result<Version> {
    let version = Version::of(&data);
    insert_locked(map, path, data, mode)?;
    Ok(version)
}

/// [`write_locked`] without the new content's version (an append does not return one:
/// hashing the first chunk of every new file was most of an append's cost).
fn insert_locked(map: &mut Map, path: &FsPath, data: Vec<u8>, mode: &WriteMode) -> Result<()> {
    if path.is_root() || is_dir(map, path) {
        return Err(Error::IsDirectory {
            path: path.to_string(),
        });
    }
    check_parents(map, path)?;
    let current = map.get(path);
    match (mode, current) {
        (WriteMode::Overwrite, _) => {}
        (WriteMode::CreateNew, Some(_)) => {
            return Err(Error::AlreadyExists {
                path: path.to_string(),
            });
        }
        (WriteMode::CreateNew, None) => {}
        (WriteMode::IfMatch(v), Some(e)) if Version::of(&e.data) == *v => {}
        (WriteMode::IfMatch(_), Some(_)) => {
            return Err(Error::Conflict {
                path: path.to_string(),
                reason: "the content is not the expected version".into(),
            });
        }
        (WriteMode::IfMatch(_), None) => {
            return Err(Error::Conflict {
                path: path.to_string(),
                reason: "the file no longer exists".into(),
            });
        }
    }
    map.insert(
        path.clone(),
        Entry {
            data,
            modified: Utc::now(),
        },
    );
    Ok(())
}

/// The direct children of the directory `path`, sorted.
fn children(map: &Map, path: &FsPath) -> Result<Vec<FileInfo>> {
    check_dir(map, path)?;
    let mut out: Vec<FileInfo> = Vec::new();
    for (k, e) in map.range(path.clone()..) {
        let Some(rel) = k.strip_prefix(path) else {
            if k.as_str().starts_with(path.as_str()) {
                continue;
            }
            break;
        };
        let Some(first) = rel.segments().next() else {
            continue;
        };
        let child = path.join_path(&FsPath::parse(first)?);
        if rel.segments().nth(1).is_some() {
            if out.last().map(|l| &l.path) != Some(&child) {
                out.push(FileInfo::dir(child));
            }
        } else {
            out.push(info(k, e));
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.dedup_by(|a, b| a.path == b.path);
    Ok(out)
}

/// Every file strictly below the directory `path`, sorted, at most `max + 1` of them.
fn below(map: &Map, path: &FsPath, max: usize) -> Result<Vec<FileInfo>> {
    check_dir(map, path)?;
    Ok(map
        .range(path.clone()..)
        .take_while(|(k, _)| k.as_str().starts_with(path.as_str()))
        .filter(|(k, _)| k.starts_with(path) && *k != path)
        .take(max.saturating_add(1))
        .map(|(k, e)| info(k, e))
        .collect())
}

/// `not_a_directory` for a file, `file_not_found` for nothing.
fn check_dir(map: &Map, path: &FsPath) -> Result<()> {
    if map.contains_key(path) {
        return Err(Error::NotADirectory {
            path: path.to_string(),
        });
    }
    if !is_dir(map, path) {
        return Err(Error::NotFound {
            path: path.to_string(),
        });
    }
    Ok(())
}

impl InMemoryFs {
    /// An empty filesystem.
    pub fn new() -> Self {
        Self::default()
    }

    /// A filesystem holding these files (paths are validated).
    pub fn with_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Result<Self> {
        let fs = Self::new();
        {
            let mut map = fs.lock();
            for (p, data) in files {
                let p = FsPath::parse(p)?;
                insert_locked(&mut map, &p, data.to_vec(), &WriteMode::Overwrite)?;
            }
        }
        Ok(fs)
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic while holding the lock cannot leave a half-written entry (every mutation
        // is a single insert/remove), so a poisoned map is still consistent.
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Filesystem for InMemoryFs {
    async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
        let map = self.lock();
        if let Some(e) = map.get(path) {
            return Ok(info(path, e));
        }
        if is_dir(&map, path) {
            return Ok(FileInfo::dir(path.clone()));
        }
        Err(Error::NotFound {
            path: path.to_string(),
        })
    }

    async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
        children(&self.lock(), path)
    }

    async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
        let map = self.lock();
        match map.get(path) {
            Some(e) => Ok(e.data.clone()),
            None if is_dir(&map, path) => Err(Error::IsDirectory {
                path: path.to_string(),
            }),
            None => Err(Error::NotFound {
                path: path.to_string(),
            }),
        }
    }

    async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
        let mut map = self.lock();
        write_locked(&mut map, path, data, &options.mode)
    }

    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
        let mut map = self.lock();
        if map.remove(path).is_some() {
            return Ok(());
        }
        if path.is_root() {
            return Err(Error::PermissionDenied {
                path: path.to_string(),
                reason: "the root cannot be deleted".into(),
            });
        }
        if !is_dir(&map, path) {
            return Err(Error::NotFound {
                path: path.to_string(),
            });
        }
        if !options.recursive {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        map.retain(|k, _| !k.starts_with(path));
        Ok(())
    }

    async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
        let mut map = self.lock();
        if from == to {
            return if map.contains_key(from) || is_dir(&map, from) {
                Ok(())
            } else {
                Err(Error::NotFound {
                    path: from.to_string(),
                })
            };
        }
        if let Some(entry) = map.get(from).cloned() {
            if to.is_root() || is_dir(&map, to) {
                return Err(Error::IsDirectory {
                    path: to.to_string(),
                });
            }
            check_parents(&map, to)?;
            if map.contains_key(to) && !options.overwrite {
                return Err(Error::AlreadyExists {
                    path: to.to_string(),
                });
            }
            map.remove(from);
            map.insert(to.clone(), entry);
            return Ok(());
        }
        if from.is_root() || !is_dir(&map, from) {
            return Err(if from.is_root() {
                Error::PermissionDenied {
                    path: from.to_string(),
                    reason: "the root cannot be moved".into(),
                }
            } else {
                Error::NotFound {
                    path: from.to_string(),
                }
            });
        }
        if to.starts_with(from) {
            return Err(Error::invalid_argument(format!(
                "cannot move {from} into itself ({to})"
            )));
        }
        if map.contains_key(to) || is_dir(&map, to) {
            return Err(Error::AlreadyExists {
                path: to.to_string(),
            });
        }
        check_parents(&map, to)?;
        let moved: Vec<FsPath> = map
            .keys()
            .filter(|k| k.starts_with(from))
            .cloned()
            .collect();
        for k in moved {
            if let (Some(e), Some(rel)) = (map.remove(&k), k.strip_prefix(from)) {
                map.insert(to.join_path(&rel), e);
            }
        }
        Ok(())
    }

    async fn exists(&self, path: &FsPath) -> Result<bool> {
        let map = self.lock();
        Ok(map.contains_key(path) || is_dir(&map, path))
    }

    async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
        let map = self.lock();
        match map.get(path) {
            Some(e) => Ok(generic::slice_range(&e.data, offset, len).to_vec()),
            None if is_dir(&map, path) => Err(Error::IsDirectory {
                path: path.to_string(),
            }),
            None => Err(Error::NotFound {
                path: path.to_string(),
            }),
        }
    }

    async fn append(&self, path: &FsPath, data: Vec<u8>, _: AppendOptions) -> Result<()> {
        let mut map = self.lock();
        if let Some(e) = map.get_mut(path) {
            e.data.extend_from_slice(&data);
            e.modified = Utc::now();
            return Ok(());
        }
        insert_locked(&mut map, path, data, &WriteMode::CreateNew)
    }

    async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
        generic::validate_edit(request)?;
        let mut map = self.lock();
        let Some(entry) = map.get_mut(path) else {
            return Err(if is_dir(&map, path) {
                Error::IsDirectory {
                    path: path.to_string(),
                }
            } else {
                Error::NotFound {
                    path: path.to_string(),
                }
            });
        };
        let (new_data, replacements) = generic::edited(path, &entry.data, request)?;
        entry.data = new_data;
        entry.modified = Utc::now();
        Ok(EditOutcome {
            replacements,
            version: Version::of(&entry.data),
        })
    }

    async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
        generic::grep_via_walk(self, request).await
    }

    async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
        generic::glob_via_walk(self, request).await
    }

    /// Every listing under one lock: one moment of the map.
    async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
        let map = self.lock();
        Ok(requests
            .iter()
            .map(|r| {
                let entries = if r.recursive {
                    below(&map, &r.path, r.max_results)
                } else {
                    children(&map, &r.path)
                };
                entries.map(|e| r.answer(e))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance() {
        crate::conformance::run_all(&InMemoryFs::new()).await;
    }
}
