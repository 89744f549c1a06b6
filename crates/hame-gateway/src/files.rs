//! The file routes of a session (`docs/gateway.md`, *Files*): list a folder, download a
//! file (with `Content-Type` and one byte range), upload one (up to
//! [`GatewayOptions::upload_limit`](crate::GatewayOptions::upload_limit)).
//!
//! They reach the caller's files through the one handle its tools use
//! ([`HarnessAgent::filesystem_for`]: the tenant view with its guard, or the scope's
//! sandbox in sandbox mode), and ask the permission rules as the agent's `list_files`,
//! `read_file` and `write_file` calls are asked ([`HarnessAgent::file_verdict`]), on the
//! path [`FsPath::parse`] gives — the one function the file tools take their path from.
//! So a path the tools refuse (`..`, NUL, `\`) is 400 `invalid_path`, another tenant's
//! file or a link out of the workspace is 404 like a file that does not exist, a runtime
//! root is 403 for writes, and a rule that denies the tool is 403 `permission_denied`.
//! A rule that *asks* lets the caller through: the caller is the person such a rule asks.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hame::fs::{FileKind, FsPath, WriteOptions};
use hame::harness::FileAccess;
use hame::harness::permissions::Outcome as Permission;
use serde::Deserialize;

use crate::error::ApiError;
use crate::routes::{InSession, SessionPath};

/// The route of one file under an agent's prefix (axum's spelling; the OpenAPI
/// document's is `{path}`).
pub(crate) const FILE_ROUTE: &str = "/sessions/{session}/files/{*path}";

/// Bytes read from the filesystem per piece of a download (1 MiB).
const CHUNK: u64 = 1024 * 1024;

/// The `{session}` and `{path}` of a file's route.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct FilePath {
    /// The session id: `[A-Za-z0-9._@-]{1,128}`.
    #[allow(dead_code)] // read by `InSession`; here for the document's parameters
    session: String,
    /// The file, from the root of the caller's files.
    path: String,
}

/// `?path=DIR` of a listing.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    path: Option<String>,
}

/// The caller's files and the path as the file tools take it, once the rules allow `tool`
/// on it: the rules as a call of `tool` in the session would meet them (its plan mode and
/// "always" answers included), and the files held as a call holds them (in sandbox mode
/// the scope's sandbox, so the request never interleaves with a turn's tools; the caller
/// closes the access to snapshot what it wrote).
async fn open(
    InSession { agent, ctx }: &InSession,
    tool: &str,
    raw: &str,
) -> Result<(FileAccess, FsPath), ApiError> {
    let verdict = agent
        .file_verdict(ctx, tool, raw)
        .await
        .map_err(|e| ApiError::from_harness(&e))?
        .map_err(|reason| invalid_path(raw, &reason))?;
    let what = format!("{tool} on {}", shown(raw));
    match verdict.outcome {
        Permission::Allow => {}
        Permission::Deny if verdict.rule == "plan mode" => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "plan_mode",
                format!(
                    "{what} is refused: session {} is in plan mode, where nothing is written; \
                     write after the plan is approved",
                    ctx.session_id
                ),
            ));
        }
        Permission::Deny => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_denied",
                format!("{what} is denied ({})", verdict.rule),
            ));
        }
        // The route cannot wait for a human: the rule's answer is someone else's to give.
        Permission::Ask => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "approval_required",
                format!(
                    "{what} needs a human's approval ({}); the file routes do not wait for one: \
                     answer an approval of this call in session {} with \"always\", or ask \
                     the operator to allow it in the permission rules",
                    verdict.rule, ctx.session_id
                ),
            ));
        }
    }
    let path = FsPath::parse(raw).map_err(|e| invalid_path(raw, &e.to_string()))?;
    let access = agent
        .file_access(ctx)
        .await
        .map_err(|e| ApiError::from_harness(&e))?;
    Ok((access, path))
}

/// Ends a request's hold of the files (in sandbox mode: the snapshot of what it wrote).
async fn close(access: FileAccess) -> Result<(), ApiError> {
    access.close().await.map_err(|e| {
        tracing::warn!(error = %e, "file route: ending the sandbox hold failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            "the sandbox's files could not be saved; retry later",
        )
    })
}

fn shown(raw: &str) -> String {
    format!("{:?}", raw.chars().take(200).collect::<String>())
}

fn invalid_path(raw: &str, reason: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_path",
        format!("the path {} is refused: {reason}", shown(raw)),
    )
    .with_param("path")
}

/// The answer for a filesystem error, by its stable code.
fn fs_error(e: &hame::fs::Error) -> ApiError {
    use hame::fs::codes;
    let code = e.code();
    let status = match code {
        codes::FILE_NOT_FOUND => StatusCode::NOT_FOUND,
        codes::PERMISSION_DENIED => StatusCode::FORBIDDEN,
        codes::INVALID_PATH | codes::IS_DIRECTORY | codes::NOT_A_DIRECTORY => {
            StatusCode::BAD_REQUEST
        }
        codes::ALREADY_EXISTS | codes::CONFLICT => StatusCode::CONFLICT,
        codes::TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        codes::NOT_SUPPORTED => StatusCode::NOT_IMPLEMENTED,
        _ => {
            tracing::warn!(error = %e, "file route: the filesystem failed");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "the files cannot be reached; retry later",
            );
        }
    };
    ApiError::new(status, code, e.to_string())
}

/// `GET /v1/sessions/{session}/files?path=DIR`: the entries of a folder (default: the
/// root of the caller's files), as the `list_files` tool sees them.
#[utoipa::path(get, path = "/v1/sessions/{session}/files", tag = "files", operation_id = "list_files",
    params(SessionPath,
        ("path" = Option<String>, Query, description = "The folder (default `/`)")),
    responses((status = 200, description = "The folder's entries", body = crate::schemas::FileList),
        (status = 403, description = "A permission rule denies `list_files` on the folder", body = crate::openapi::ErrorBody),))]
pub(crate) async fn list(
    on: InSession,
    Query(q): Query<ListQuery>,
) -> Result<Json<crate::schemas::FileList>, ApiError> {
    let raw = q.path.unwrap_or_else(|| "/".to_owned());
    let (access, dir) = open(&on, "list_files", &raw).await?;
    let listed = access.files().list(&dir).await;
    close(access).await?;
    let mut entries: Vec<crate::schemas::FileEntry> = listed
        .map_err(|e| fs_error(&e))?
        .into_iter()
        .map(|f| crate::schemas::FileEntry {
            path: format!("/{}", f.path.as_str()),
            kind: match f.kind {
                FileKind::File => "file",
                FileKind::Dir => "dir",
            }
            .to_owned(),
            size: f.size,
            modified: f.modified.map(|t| t.to_rfc3339()),
        })
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Json(crate::schemas::FileList {
        session: on.ctx.session_id,
        path: format!("/{}", dir.as_str()),
        entries,
    }))
}

/// One byte range of a file of `size` bytes: `Ok(None)` without a `Range` header (or
/// with one this route does not take: several ranges, another unit — the whole file is
/// sent then, as RFC 9110 allows), `Err` for a range the file cannot satisfy (416).
fn byte_range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().strip_prefix("bytes="))
    else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
        // `bytes=-N`: the last N bytes.
        (None, Some(n)) if a.is_empty() => {
            if n == 0 || size == 0 {
                return Err(());
            }
            (size.saturating_sub(n), size - 1)
        }
        (Some(s), None) if b.is_empty() => (s, size.saturating_sub(1)),
        (Some(s), Some(e)) if s <= e => (s, e.min(size.saturating_sub(1))),
        _ => return Ok(None),
    };
    if start >= size {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// The media type of a file by its extension (`application/octet-stream` otherwise).
fn content_type(path: &FsPath) -> &'static str {
    let ext = path
        .as_str()
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" => "text/plain; charset=utf-8",
        "md" => "text/markdown; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "xml" => "application/xml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "wasm" => "application/wasm",
        "py" | "rs" | "sh" | "go" | "ts" | "c" | "h" | "java" | "rb" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// `GET /v1/sessions/{session}/files/{path}`: the file, with its `Content-Type` and
/// `Accept-Ranges: bytes`; `Range: bytes=A-B` (one range) answers 206 with that part.
/// Sent in 1 MiB pieces as they are read.
#[utoipa::path(get, path = "/v1/sessions/{session}/files/{path}", tag = "files", operation_id = "download_file",
    params(FilePath,
        ("Range" = Option<String>, Header, description = "One byte range, `bytes=A-B`, `bytes=A-` or `bytes=-N`")),
    responses((status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 206, description = "The requested range (`Content-Range`)", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 403, description = "A permission rule denies `read_file` on the path", body = crate::openapi::ErrorBody),
        (status = 416, description = "The range is past the end of the file", body = crate::openapi::ErrorBody),))]
pub(crate) async fn download(
    on: InSession,
    Path(FilePath { path, .. }): Path<FilePath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // An early answer drops the access: the sandbox hold ends in a task of its own.
    let (access, path) = open(&on, "read_file", &path).await?;
    let fs = access.files().clone();
    let session = &on.ctx.session_id;
    let info = fs.stat(&path).await.map_err(|e| fs_error(&e))?;
    if info.kind == FileKind::Dir {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "is_directory",
            format!(
                "/{} is a folder: list it with GET /v1/sessions/{session}/files?path=/{}",
                path.as_str(),
                path.as_str()
            ),
        ));
    }
    let size = info.size;
    let (status, start, end) = match byte_range(&headers, size) {
        Ok(None) => (StatusCode::OK, 0, size),
        Ok(Some((s, e))) => (StatusCode::PARTIAL_CONTENT, s, e + 1),
        Err(()) => {
            let mut resp = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the file has {size} bytes"),
            )
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                resp.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(resp);
        }
    };
    let media = content_type(&path);
    // The first piece is read before answering, so a file that cannot be read is an error
    // answer rather than a cut body.
    let first_len = (end - start).min(CHUNK);
    let first = if first_len == 0 {
        Vec::new()
    } else {
        fs.read_range(&path, start, first_len)
            .await
            .map_err(|e| fs_error(&e))?
    };
    let rest = futures::stream::unfold(start + first_len, move |at| {
        let (fs, path) = (fs.clone(), path.clone());
        async move {
            if at >= end {
                return None;
            }
            let len = (end - at).min(CHUNK);
            match fs.read_range(&path, at, len).await {
                Ok(bytes) if !bytes.is_empty() => {
                    let next = at + bytes.len() as u64;
                    Some((Ok::<_, std::io::Error>(bytes), next))
                }
                // Shorter than its size said (it changed): end the body there.
                Ok(_) => None,
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), end)),
            }
        }
    });
    // The hold lasts until the last piece is read.
    let closed = futures::stream::once(async move {
        if let Err(e) = access.close().await {
            tracing::warn!(error = %e, "file route: ending the sandbox hold after a download failed");
        }
    })
    .filter_map(|()| async { None::<Result<Vec<u8>, std::io::Error>> });
    let body = Body::from_stream(
        futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
            .chain(rest)
            .chain(closed),
    );
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(v) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", end - 1))
    {
        h.insert(header::CONTENT_RANGE, v);
    }
    Ok(resp)
}

/// `PUT /v1/sessions/{session}/files/{path}`: writes the body as the file (replacing it;
/// folders are made as needed): 201 for a new file, 200 for a replaced one. Bodies over
/// [`GatewayOptions::upload_limit`](crate::GatewayOptions::upload_limit) are 413.
#[utoipa::path(put, path = "/v1/sessions/{session}/files/{path}", tag = "files", operation_id = "upload_file",
    params(FilePath),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's bytes"),
    responses((status = 201, description = "A new file", body = crate::schemas::FileWritten),
        (status = 200, description = "A replaced file", body = crate::schemas::FileWritten),
        (status = 403, description = "A permission rule denies `write_file` on the path, or it is hame's own data", body = crate::openapi::ErrorBody),))]
pub(crate) async fn upload(
    on: InSession,
    Path(FilePath { path, .. }): Path<FilePath>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let (access, path) = open(&on, "write_file", &path).await?;
    let fs = access.files();
    let existed = match fs.stat(&path).await {
        Ok(info) if info.kind == FileKind::Dir => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "is_directory",
                format!("/{} is a folder", path.as_str()),
            ));
        }
        Ok(_) => true,
        Err(e) if e.is_not_found() => false,
        Err(e) => return Err(fs_error(&e)),
    };
    let size = body.len() as u64;
    let written = fs
        .write(&path, body.to_vec(), WriteOptions::default())
        .await;
    close(access).await?;
    written.map_err(|e| fs_error(&e))?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(crate::schemas::FileWritten {
            session: on.ctx.session_id,
            path: format!("/{}", path.as_str()),
            size,
        }),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(v: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(header::RANGE, v);
        }
        byte_range(&h, size)
    }

    #[test]
    fn ranges_are_read_as_rfc_9110_writes_them() {
        assert_eq!(range("bytes=0-9", 100), Ok(Some((0, 9))));
        assert_eq!(range("bytes=90-", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-10", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-500", 100), Ok(Some((0, 99))));
        assert_eq!(range("bytes=50-500", 100), Ok(Some((50, 99))));
        assert_eq!(range("bytes=100-", 100), Err(()));
        assert_eq!(range("bytes=-0", 100), Err(()));
        assert_eq!(range("bytes=0-0", 0), Err(()));
        // Not taken: the whole file.
        assert_eq!(range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(range("items=0-1", 100), Ok(None));
        assert_eq!(range("bytes=9-2", 100), Ok(None));
        assert_eq!(range("bytes=x-y", 100), Ok(None));
        assert_eq!(range("", 100), Ok(None));
    }

    #[test]
    fn media_types_come_from_the_extension() -> Result<(), hame::fs::Error> {
        assert_eq!(
            content_type(&FsPath::parse("a/b.TXT")?),
            "text/plain; charset=utf-8"
        );
        assert_eq!(content_type(&FsPath::parse("x.png")?), "image/png");
        assert_eq!(
            content_type(&FsPath::parse("noext")?),
            "application/octet-stream"
        );
        Ok(())
    }
}
