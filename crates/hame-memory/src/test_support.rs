//! Helpers shared by this crate's unit tests.

use chrono::{DateTime, NaiveDate, Utc};

/// `h:m` UTC on 2026-03-14, the day the daily-log and consolidation tests run on.
pub(crate) fn at(h: u32, m: u32) -> DateTime<Utc> {
    NaiveDate::from_ymd_opt(2026, 3, 14)
        .and_then(|d| d.and_hms_opt(h, m, 0))
        .map(|t| t.and_utc())
        .unwrap_or_else(|| panic!("no time {h}:{m}"))
}

/// An image of some 880 KiB (a PNG signature repeated): big enough that counting or pasting
/// its base64 would show.
pub(crate) fn big_image() -> hame_core::ImageBlock {
    hame_core::ImageBlock {
        media_type: "image/png".into(),
        data: "iVBORw0KGgo=".repeat(100_000),
    }
}
