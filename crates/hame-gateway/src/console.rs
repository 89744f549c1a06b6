//! The web console at `/`: one static page (HTML, CSS and JS in one file, built into the
//! binary; no Node build step). It uses the same API as any client.

use axum::http::header;
use axum::response::IntoResponse;

use crate::routes::Caller;

const PAGE: &str = include_str!("console.html");

/// `GET /`: the console (with auth, the token comes as `/?token=` and the page sends it as
/// a bearer header).
pub(crate) async fn page(_caller: Caller) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
