//! Integration tests of hame-fs-remote: one binary, one module per backend.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    clippy::panic
)]

mod suite;
