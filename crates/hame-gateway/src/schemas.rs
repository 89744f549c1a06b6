//! The bodies of the gateway's routes as types: what they serialise and what the OpenAPI
//! document (`crate::openapi`) describes, from one definition.

use serde::Serialize;
use utoipa::ToSchema;

/// `GET /v1/sessions/{session}/files`: a folder's entries.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileList {
    /// The session.
    pub(crate) session: String,
    /// The folder listed (`/` is the root of the caller's files).
    pub(crate) path: String,
    /// Its entries, by path.
    pub(crate) entries: Vec<FileEntry>,
}

/// One entry of a folder.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileEntry {
    /// Its path, from the root of the caller's files.
    pub(crate) path: String,
    /// `file` or `dir`.
    pub(crate) kind: String,
    /// Bytes (0 for a folder).
    pub(crate) size: u64,
    /// When it last changed (RFC 3339), when the storage knows.
    pub(crate) modified: Option<String>,
}

/// `PUT /v1/sessions/{session}/files/{path}`: the file written.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FileWritten {
    /// The session.
    pub(crate) session: String,
    /// The file's path, from the root of the caller's files.
    pub(crate) path: String,
    /// Its size in bytes.
    pub(crate) size: u64,
}
