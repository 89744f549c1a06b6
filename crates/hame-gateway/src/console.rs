//! The web console at `/`: one static page (HTML, CSS and JS in one file, built into the
//! binary; no Node build step). It uses the same API as any client.

use axum::http::header;
use axum::response::IntoResponse;

use crate::openapi::ErrorBody;
use crate::routes::Caller;

const PAGE: &str = include_str!("console.html");

/// `GET /`: the console (with auth, the token comes as `/?token=` and the page sends it as
/// a bearer header).
#[utoipa::path(get, path = "/", tag = "server",
    params(("token" = Option<String>, Query, description = "The bearer token (with `--auth`: a page cannot send a header)")),
    responses((status = 200, description = "The web console", content_type = "text/html", body = String),
        (status = 401, description = "No valid token", body = ErrorBody)))]
pub(crate) async fn page(_caller: Caller) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
