//! Integration tests of hame-sandbox against a real Docker engine (`HAME_TEST_DOCKER=1`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    clippy::panic
)]

#[cfg(feature = "docker")]
mod suite;
