//! The integration tests of hame-session: one binary, modules under `suite/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
