//! [`FsPath`]: the validated virtual path at the trait boundary.

use std::fmt;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;

use crate::error::{Error, Result};

/// Longest allowed segment (file or directory name), in bytes. Matches `NAME_MAX` on Linux.
pub const MAX_SEGMENT_BYTES: usize = 255;
/// Longest allowed path, in bytes (without the leading `/`). Matches `PATH_MAX` on Linux.
pub const MAX_PATH_BYTES: usize = 4096;
/// Deepest allowed nesting.
pub const MAX_DEPTH: usize = 128;

/// A validated, normalised path inside a filesystem.
///
/// Paths are virtual: `/` is the root of the filesystem, never the host root, and a leading
/// `/` is optional (`/a/b` and `a/b` are the same path). Rules, checked by [`FsPath::parse`]:
///
/// * segments are separated by `/`; empty segments and `.` are dropped;
/// * a `..` segment is refused (no normalisation: `a/../b` is an error, not `b`);
/// * NUL, ASCII control characters and `\` are refused;
/// * a segment is at most [`MAX_SEGMENT_BYTES`] bytes, the path at most [`MAX_PATH_BYTES`]
///   bytes and [`MAX_DEPTH`] segments;
/// * nothing is decoded: `%2e%2e` is a file literally named `%2e%2e`, `~` is a name.
///
/// The string form ([`FsPath::as_str`]) has no leading `/` (the root is `""`); [`Display`]
/// adds one (`/a/b`, root is `/`).
///
/// [`Display`]: std::fmt::Display
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FsPath(String);

impl FsPath {
    /// The root.
    pub fn root() -> Self {
        FsPath(String::new())
    }

    /// Parses and normalises a path.
    pub fn parse(input: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidPath {
            path: input.chars().take(300).collect(),
            reason: reason.to_owned(),
        };
        if input.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if input.chars().any(|c| c.is_ascii_control()) {
            return Err(bad("contains a control character"));
        }
        if input.contains('\\') {
            return Err(bad("contains `\\`; use `/` as the separator"));
        }
        let mut out = String::with_capacity(input.len());
        let mut depth = 0usize;
        for seg in input.split('/') {
            match seg {
                "" | "." => continue,
                ".." => return Err(bad("`..` is not allowed; use a path from the root")),
                s if s.len() > MAX_SEGMENT_BYTES => {
                    return Err(bad(&format!(
                        "a name is longer than {MAX_SEGMENT_BYTES} bytes"
                    )));
                }
                s => {
                    if !out.is_empty() {
                        out.push('/');
                    }
                    out.push_str(s);
                    depth += 1;
                }
            }
        }
        if out.len() > MAX_PATH_BYTES {
            return Err(bad(&format!("longer than {MAX_PATH_BYTES} bytes")));
        }
        if depth > MAX_DEPTH {
            return Err(bad(&format!("deeper than {MAX_DEPTH} levels")));
        }
        Ok(FsPath(out))
    }

    /// The normalised form without a leading `/` (`""` for the root).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The segments.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// The last segment (`""` for the root).
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or("")
    }

    /// The parent (`None` for the root).
    pub fn parent(&self) -> Option<FsPath> {
        if self.is_root() {
            return None;
        }
        Some(match self.0.rfind('/') {
            Some(i) => FsPath(self.0[..i].to_owned()),
            None => FsPath::root(),
        })
    }

    /// Appends a relative path (validated).
    pub fn join(&self, rel: &str) -> Result<FsPath> {
        let rel = FsPath::parse(rel)?;
        Ok(self.join_path(&rel))
    }

    /// Appends an already validated path.
    pub fn join_path(&self, rel: &FsPath) -> FsPath {
        match (self.is_root(), rel.is_root()) {
            (_, true) => self.clone(),
            (true, false) => rel.clone(),
            (false, false) => FsPath(format!("{}/{}", self.0, rel.0)),
        }
    }

    /// The form that policy checks compare (permission rules, plan mode, subagent deny
    /// rules): this path — already the exact path a tool touches, since both the tool and
    /// the check take it from [`FsPath::parse`] — in Unicode NFC, and lower-cased when the
    /// backend folds case ([`NameCase::Insensitive`]). Two spellings a backend takes for
    /// one file (`a//b`, `./a/b`, `a/b/`, NFD and NFC forms, and on a case-folding backend
    /// `A/B`) have one key. The key may be coarser than the backend (on Linux `café` in NFC
    /// and NFD are two files with one key): a rule then covers both, never neither.
    /// Match it against patterns normalised by [`pattern_key`].
    pub fn match_key(&self, case: NameCase) -> String {
        let nfc: String = self.0.nfc().collect();
        match case {
            NameCase::Sensitive => nfc,
            NameCase::Insensitive => nfc.to_lowercase(),
        }
    }

    /// Whether `self` is `prefix` or lies below it (segment-wise: `ab` is not below `a`).
    pub fn starts_with(&self, prefix: &FsPath) -> bool {
        prefix.is_root()
            || self.0 == prefix.0
            || (self.0.starts_with(&prefix.0)
                && self.0.as_bytes().get(prefix.0.len()) == Some(&b'/'))
    }

    /// `self` relative to `prefix`, when it lies below it.
    pub fn strip_prefix(&self, prefix: &FsPath) -> Option<FsPath> {
        if !self.starts_with(prefix) {
            return None;
        }
        if prefix.is_root() {
            return Some(self.clone());
        }
        let rest = &self.0[prefix.0.len()..];
        Some(FsPath(rest.trim_start_matches('/').to_owned()))
    }
}

/// Whether a backend takes two names that differ only in case for one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum NameCase {
    /// `A` and `a` are two files (Linux filesystems by default, Redis, object storage,
    /// memory).
    #[default]
    Sensitive,
    /// `A` and `a` are one file (macOS and Windows defaults, FAT/exFAT, CIFS, ext4
    /// directories with the casefold attribute).
    Insensitive,
}

/// A glob over paths in the form [`FsPath::match_key`] gives paths: leading `/` and `./`,
/// empty and `.` segments and a trailing `/` dropped, NFC, lower-cased for
/// [`NameCase::Insensitive`]. Glob syntax passes through (`*`, `**`, `?`, `[..]`, `{a,b}`);
/// a `..` segment is kept (it then matches no key, as no path has one).
pub fn pattern_key(pattern: &str, case: NameCase) -> String {
    let joined = pattern
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/");
    let nfc: String = joined.nfc().collect();
    match case {
        NameCase::Sensitive => nfc,
        NameCase::Insensitive => nfc.to_lowercase(),
    }
}

impl fmt::Display for FsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.0)
    }
}

impl fmt::Debug for FsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FsPath({:?})", self.to_string())
    }
}

impl std::str::FromStr for FsPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        FsPath::parse(s)
    }
}

impl TryFrom<&str> for FsPath {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        FsPath::parse(s)
    }
}

impl Serialize for FsPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FsPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FsPath::parse(&s).map_err(serde::de::Error::custom)
    }
}
