//! Backoff between compare-and-set attempts.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Longest pause between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// Sleeps before attempt `attempt` (0-based; attempt 0 does not sleep): exponential from
/// 2 ms, capped at [`MAX_BACKOFF`], with full jitter so racing writers spread out.
pub(crate) async fn backoff(attempt: usize) {
    if attempt == 0 {
        return;
    }
    let ceiling = Duration::from_millis(2)
        .saturating_mul(1u32 << attempt.min(10))
        .min(MAX_BACKOFF);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(attempt);
    let frac = (h.finish() % 1000) as u32;
    tokio::time::sleep(ceiling * frac / 1000).await;
}
