//! Integration tests: the real clients over real HTTP against the scripted server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
